"""The kubelet's device IDs, written compactly in the log.

A container's ``ContainerAssigned`` names the device IDs the kubelet gave it. With MiB
units a whole 80 GB card is some 81,000 IDs (``<card>-0`` … ``<card>-81558``): over a
megabyte written out, more than a NATS message may hold. IDs are numbered per card and
the kubelet hands out mostly consecutive ones, so a run of consecutive numbers of one
card is written ``<card>-<first>..<last>``; anything else is written as it is.
:func:`expand_ids` gives back the same set.
"""

from __future__ import annotations

from collections.abc import Iterable

RUN = ".."


def _split(device: str) -> tuple[str, int] | None:
    prefix, sep, number = device.rpartition("-")
    if not sep or not prefix or not number.isdigit() or (number != "0" and number[0] == "0"):
        return None
    return prefix, int(number)


def compact_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """``ids`` as runs per card, sorted; IDs of another shape kept as they are."""
    numbered: dict[str, set[int]] = {}
    others: set[str] = set()
    for device in ids:
        split = _split(device)
        if split is None:
            others.add(device)
        else:
            numbered.setdefault(split[0], set()).add(split[1])
    written: list[str] = []
    for prefix in sorted(numbered):
        numbers = sorted(numbered[prefix])
        first = last = numbers[0]
        for number in [*numbers[1:], None]:
            if number is not None and number == last + 1:
                last = number
                continue
            written.append(f"{prefix}-{first}" if first == last else f"{prefix}-{first}{RUN}{last}")
            if number is not None:
                first = last = number
    return (*written, *sorted(others))


def expand_ids(written: Iterable[str]) -> tuple[str, ...]:
    """The IDs :func:`compact_ids` wrote (an ID written out in full stays as it is)."""
    ids: list[str] = []
    for entry in written:
        prefix, sep, numbers = entry.rpartition("-")
        first, run, last = numbers.partition(RUN)
        if sep and run and first.isdigit() and last.isdigit():
            ids.extend(f"{prefix}-{n}" for n in range(int(first), int(last) + 1))
        else:
            ids.append(entry)
    return tuple(ids)

# syntax=docker/dockerfile:1
# The gpushare image: one entry point, `gpushare <command>` (allocator, binder, reporter,
# node-agent, audit, inspect, ...). Dependencies are pinned by constraints.txt.
FROM python:3.11.14-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpushare
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
RUN /opt/gpushare/bin/pip install -c constraints.txt .

FROM python:3.11.14-slim-bookworm
ENV PATH=/opt/gpushare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUSHARE_LOG_FORMAT=json
COPY --from=build /opt/gpushare /opt/gpushare
RUN groupadd --system --gid 65532 gpushare \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gpushare
# The node-agent container alone runs as root (it owns sockets in the kubelet's
# directories); its manifest says so with runAsUser: 0.
USER 65532:65532
ENTRYPOINT ["gpushare"]
CMD ["--help"]

"""The committed NATS users and permissions are what the code generates."""

from __future__ import annotations

from pathlib import Path

from tools import generate_nats_auth


def test_committed_auth_conf_is_up_to_date() -> None:
    assert generate_nats_auth.main(["--check"]) == 0


def test_an_overlay_renders_its_own_nodes(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("# ours\nrack1.gpu-7\n\n")
    out = tmp_path / "auth.conf"
    assert generate_nats_auth.main(["--nodes", str(nodes), "--out", str(out)]) == 0
    text = out.read_text()
    assert 'user: "node-rack1.gpu-7"' in text
    assert '"gpushare.alloc.rack1~gpu-7.agent"' in text
    assert "$GPUSHARE_NATS_PASSWORD_NODE_RACK1_GPU_7" in text
    assert generate_nats_auth.main(["--check", "--nodes", str(nodes), "--out", str(out)]) == 0

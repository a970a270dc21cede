"""`ferry bench` and `ferry validate` on several devices with each layer's KV placed: the shared
options and every refusal, bench's per-device figures (a device-resident layer copies nothing, a
host-resident one what it copies from the host on one device), and validate's placements: every
hash the all-host one-device hash, keys naming the placement, and a gate that fails when one
placement's outputs differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

import ferry
from conftest import refused
from ferry.cli import build_parser, main
from ferry.workloads import validate as validate_workload
from ferry.workloads.common import POLICIES
from ferry.workloads.devices import STANDIN_LINK_GBPS, DeviceConfig, parse_placement, parse_size, read_placement

BENCH = ["-c", "64", "-npl", "2", "-npp", "8", "-ntg", "2", "--layers", "4", "--heads", "2", "--head-dim", "32",
         "--kv-heads", "1", "--device", "cpu", "--repeat", "1", "--policy", "ranges"]
VALIDATE = ["-c", "32", "-npl", "2", "--sequences", "4", "-npp", "14", "-ntg", "2", "--heads", "2", "--head-dim", "32",
            "--kv-heads", "1", "--device", "cpu"]
DEVICE_OPTIONS = ["--devices", "--link-gbps", "--latency-us", "--device-memory", "--kv-device-layers", "--placement",
                  "--layer-devices", "--v-trans"]


def run_json(args: List[str], capsys: pytest.CaptureFixture[str]) -> Any:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------ options


def test_both_verbs_take_the_device_options() -> None:
    parsers = {verb: p for verb, (_, p) in build_parser()[1].items()}
    for verb in ("bench", "validate"):
        have = {s for a in parsers[verb]._actions for s in a.option_strings}
        assert set(DEVICE_OPTIONS) <= have, verb
    help_text = parsers["bench"].format_help()
    assert "; on stand-ins" in help_text


def test_device_options_parse_sizes_lists_and_placements_and_default_to_one_device() -> None:
    assert parse_size("64MiB", "x") == 64 << 20 == parse_size("64M", "x")
    assert parse_size("500MB", "x") == 500_000_000 and parse_size("1GiB", "x") == 1 << 30
    assert parse_size("4096", "x") == 4096 and parse_size("1.5KiB", "x") == 1536
    assert parse_placement("h, 0,1 ,H") == (None, 0, 1, None)
    args = build_parser()[0].parse_args(["bench", "--devices", "2", "--link-gbps", "2.45,0.33", "--latency-us", "5",
                                         "--device-memory", "64MiB,1GiB", "--layer-devices", "1,0"])
    assert (args.devices, args.link_gbps, args.latency_us, args.device_memory, args.layer_devices) == (
        2, (2.45, 0.33), (5.0,), (64 << 20, 1 << 30), (1, 0))
    defaults = build_parser()[0].parse_args(["validate"])
    assert (defaults.devices, defaults.link_gbps, defaults.placement, defaults.kv_device_layers) == (1, None, None, None)


def test_placement_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "placement.txt"
    path.write_text("h\n0\n1,\nh\n")
    assert read_placement(str(path)) == (None, 0, 1, None)
    args = build_parser()[0].parse_args(["bench", "--placement", str(path)])
    assert args.placement == (None, 0, 1, None)
    path.write_text("h,,0\n")
    err = refused(["bench", *BENCH, "--placement", str(path)], capsys)
    assert f"argument --placement: --placement {path} 'h,,0': item 2 is empty" in err


@pytest.mark.parametrize("args,message", [
    (["--kv-device-layers", "1", "--placement", "h,0,0,h"], "--kv-device-layers and --placement both say where"),
    (["--devices", "2", "--link-gbps", "1,2,3"], "--link-gbps: 3 values for 2 devices"),
    (["--devices", "2", "--latency-us", "1,2,3"], "--latency-us: 3 values for 2 devices"),
    (["--devices", "3", "--device-memory", "1MiB,1MiB"], "--device-memory: 2 values for 3 devices"),
    (["--placement", "h,0,0"], "--placement: 3 items for 4 layers"),
    (["--layer-devices", "0,0"], "--layer-devices: 2 items for 4 layers"),
    (["--placement", "h,,0,0"], "argument --placement: --placement 'h,,0,0': item 2 is empty"),
    (["--link-gbps", "2.45,"], "argument --link-gbps: --link-gbps '2.45,': item 2 is empty"),
    (["--placement", ""], "argument --placement: --placement: expected a list"),
    (["--devices", "2", "--placement", "h,0,2,h"], "--placement: layer 2 names device 2, but --devices 2 has 0..1"),
    (["--placement", "h,0,1,h"], "--placement: layer 2 names device 1, but --devices 1 has 0..0"),
    (["--devices", "2", "--layer-devices", "0,1,1,5"], "--layer-devices: layer 3 names device 5"),
    (["--placement", "h,0,x,h"], "'x' is neither h (host) nor a device index"),
    (["--layer-devices", "0,h,0,0"], "'h' is not a device index"),
    (["--device", "cuda", "--link-gbps", "2.45"], "--link-gbps acts only on stand-ins"),
    (["--device", "cuda", "--device-memory", "64MiB"], "--device-memory acts only on stand-ins"),
    (["--device-memory", "64XB"], "argument --device-memory: --device-memory: '64XB' is not a size"),
    (["--link-gbps", "fast"], "argument --link-gbps: --link-gbps: 'fast' is not a number"),
    (["--link-gbps", "0.0001"], "argument --link-gbps: --link-gbps: 0.0001 is out of range: 0 (unmodelled) or"),
    (["--link-gbps", "-1"], "argument --link-gbps: --link-gbps: -1 is out of range"),
    (["--kv-device-layers", "5"], "--kv-device-layers 5: the model has 4 layers"),
    (["--kv-device-layers", "-1"], "argument --kv-device-layers: -1 is out of range"),
    (["--devices", "0"], "argument --devices: 0 is out of range"),
])
@pytest.mark.parametrize("verb", ["bench", "validate"])
def test_refusals_exit_2_with_the_message(verb: str, args: List[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = BENCH if verb == "bench" else [*VALIDATE, "--layers", "4"]
    assert message in refused([verb, *base, *args], capsys)


def test_v_trans_is_refused_with_q8_0(capsys: pytest.CaptureFixture[str]) -> None:
    for verb, base in (("bench", BENCH), ("validate", VALIDATE)):
        err = refused([verb, *base, "--type", "q8_0", "--v-trans"], capsys)
        assert "--v-trans needs --type f32 or f16" in err


def test_a_device_without_room_for_its_layers_fails_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32, item 11: the device and the option to change, as a usage error (exit 2)."""
    err = refused(["bench", *BENCH, "--kv-device-layers", "4", "--device-memory", "4KiB"], capsys)
    assert "--device-memory: device 0 (4,096 bytes) cannot hold" in err
    err = refused(["validate", "--devices", "2", "--device-memory", "1KiB,100MiB"], capsys)
    assert "--device-memory: device 0 (1,024 bytes) cannot hold" in err


# ------------------------------------------------------------ bench


def devices_of(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    assert len(rows) == 1
    return list(rows[0]["devices"])


def test_a_device_resident_layer_copies_nothing_and_a_host_one_its_share(capsys: pytest.CaptureFixture[str]) -> None:
    """Two stand-ins on unequal links, layers 0-1 on device 0 and 2-3 on device 1: a device-resident
    layer copies nothing, a host-resident layer copies its share of the one-device all-host run."""
    one = run_json(["bench", *BENCH, "--no-unified", "--json"], capsys)
    (d,) = devices_of(one)
    assert d["index"] == 0 and d["layers"] == [0, 1, 2, 3] and d["resident_layers"] == []
    # the queries live on it; the lengths live in host memory, ntg x npl int32 copied per repetition
    assert d["kv_bytes_copied"] == one[0]["bytes_copied"] > 0 and d["bytes_copied"] == d["kv_bytes_copied"] + 2 * 2 * 4
    share = d["kv_bytes_copied"] // 4  # equal layers: each copies a quarter
    assert share * 4 == d["kv_bytes_copied"]

    two = ["bench", *BENCH, "--json", "--devices", "2", "--link-gbps", "2.45,0.33", "--latency-us", "1"]
    rows = run_json([*two, "--placement", "0,h,h,1"], capsys)
    assert [(r["unified"], r["policy"]) for r in rows] == [(False, "ranges")]  # the unified layout is skipped
    d0, d1 = devices_of(rows)
    assert set(d0) == {"index", "name", "layers", "resident_layers", "bytes_copied", "kv_bytes_copied", "copy_s",
                       "memory_bytes", "link_gbps"}
    assert (d0["index"], d0["layers"], d0["resident_layers"], d0["link_gbps"]) == (0, [0, 1], [0], 2.45)
    assert (d1["index"], d1["layers"], d1["resident_layers"], d1["link_gbps"]) == (1, [2, 3], [3], 0.33)
    assert d0["kv_bytes_copied"] == d1["kv_bytes_copied"] == share  # layers 1 and 2
    # the lengths live in host memory: each device receives them (npl i32, 2 steps)
    assert d0["bytes_copied"] == d1["bytes_copied"] == share + 2 * 4 * 2
    assert d1["copy_s"] > share / 0.33e9 and d0["copy_s"] > share / 2.45e9
    layer = 2 * 64 * 32 * 2  # a resident layer: K and V of 64 cells of 32 f16 values (one KV head)
    assert d0["memory_bytes"] >= layer and d1["memory_bytes"] >= layer

    rows = run_json([*two, "--kv-device-layers", "4"], capsys)
    d0, d1 = devices_of(rows)
    assert d0["resident_layers"] == [0, 1] and d1["resident_layers"] == [2, 3]
    assert d0["kv_bytes_copied"] == d1["kv_bytes_copied"] == rows[0]["bytes_copied"] == 0  # a row counts windows
    assert d0["bytes_copied"] == d1["bytes_copied"] == 2 * 4 * 2  # the lengths alone

    rows = run_json([*two, "--kv-device-layers", "1"], capsys)
    d0, d1 = devices_of(rows)
    assert (d0["resident_layers"], d0["kv_bytes_copied"], d1["kv_bytes_copied"]) == ([0], share, 2 * share)


def test_the_standin_link_is_modelled_unless_0_asks_for_the_hosts_speed(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --link-gbps a stand-in's copies are held to STANDIN_LINK_GBPS, and the header says so;
    --link-gbps 0 leaves them at the host's memcpy speed, unmodelled."""
    rows = run_json(["bench", *BENCH, "--no-unified", "--json"], capsys)
    (d,) = devices_of(rows)
    assert d["link_gbps"] == STANDIN_LINK_GBPS == 8.0
    assert d["copy_s"] >= d["bytes_copied"] / (STANDIN_LINK_GBPS * 1e9)  # a repetition's copies, held to the link
    assert rows[0]["config"]["devices"]["link_gbps"] == []  # nothing asked: auto may still pick CUDA
    (d,) = devices_of(run_json(["bench", *BENCH, "--no-unified", "--json", "--link-gbps", "0"], capsys))
    assert d["link_gbps"] is None
    assert main(["bench", *BENCH, "--no-unified"]) == 0
    assert "split on CPU (stand-in device), link 8 GB/s;" in capsys.readouterr().out
    assert main(["bench", *BENCH, "--no-unified", "--link-gbps", "0"]) == 0
    assert "link" not in capsys.readouterr().out.splitlines()[0]
    assert DeviceConfig(link_gbps=(0.0, 2.0), n_devices=2).standin_link(0) == 0.0
    assert [s.link_gbps for s in DeviceConfig(n_devices=2).make("cpu")] == [8.0, 8.0]


def test_bench_text_lists_the_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *BENCH, "--devices", "2", "--link-gbps", "2.45,0.33", "--placement", "0,h,h,1"]) == 0
    out = capsys.readouterr().out
    assert "devices: 2; KV placement 0,h,h,1" in out
    assert "link 2.45 GB/s, 0.33 GB/s;" in out.splitlines()[0]
    assert "unified cache: not run (one device with every layer on the host only)" in out
    lines = [ln.split() for ln in out.splitlines() if "(stand-in device)" in ln and ln.lstrip().startswith("2 ")]
    assert [(ln[2], ln[-2]) for ln in lines] == [("0:", "2.45"), ("1:", "0.33")]
    assert "outputs identical across policies;" in out


def test_a_layer_held_on_another_device_copies_what_a_host_layer_copies(capsys: pytest.CaptureFixture[str]) -> None:
    """A layer held by another device than the one that runs it is copied from there: under ranges, exactly
    the bytes a host-resident layer copies."""
    rows = run_json(["bench", *BENCH, "--json", "--devices", "2", "--layer-devices", "1,0,1,0",
                     "--placement", "0,0,h,h"], capsys)
    d0, d1 = devices_of(rows)
    assert (d0["layers"], d0["resident_layers"], d1["layers"], d1["resident_layers"]) == ([1, 3], [0, 1], [0, 2], [])
    assert d0["kv_bytes_copied"] > 0 and d1["kv_bytes_copied"] == 2 * d0["kv_bytes_copied"]


# ------------------------------------------------------------ validate


@pytest.mark.parametrize("devices,layers,extra", [
    ("2", "4", ["--type", "f16"]),
    ("2", "3", ["--type", "q8_0"]),
    ("3", "5", ["--v-trans"]),
    ("3", "3", ["--type", "q8_0", "--kv-device-layers", "2"]),
])
def test_validate_hashes_every_placement_and_policy_alike(devices: str, layers: str, extra: List[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    [got] = run_json(["validate", *VALIDATE, "--json", "--devices", devices, "--layers", layers, *extra], capsys)
    assert got["identical"] is True and got["control_detected"] is True
    n = int(layers)
    half = n // 2
    names = ["one-device", "host", "device", f"first{half}", "alternate", "random"]
    if "--kv-device-layers" in extra:
        names.append("first2")
    names = list(dict.fromkeys(names))
    assert list(got["placements"]) == names
    assert got["placements"]["host"] == ",".join(["h"] * n)
    assert got["placements"]["device"] == ",".join(str(i * int(devices) // n) for i in range(n))
    keys = [f"{p}/{policy}{o}" for p in names for policy in POLICIES for o in ("", "+overlap", "+overlap-within")]
    assert list(got["hashes"]) == keys
    assert len(set(got["hashes"].values())) == 1


def test_validate_names_the_users_placement(capsys: pytest.CaptureFixture[str]) -> None:
    [got] = run_json(["validate", *VALIDATE, "--json", "--devices", "2", "--layers", "4", "--placement", "1,h,0,h",
                    "--policy", "ranges", "--no-overlap"], capsys)
    assert list(got["hashes"])[-1] == "1,h,0,h/ranges" and got["placements"]["1,h,0,h"] == "1,h,0,h"
    assert got["identical"] is True
    assert main(["validate", *VALIDATE, "--placement", "0,h", "--policy", "ranges", "--no-overlap"]) == 0
    out = capsys.readouterr().out
    assert "  first1: 0,h" in out and "  0,h/ranges" not in out  # the user's map is first1's: run once
    assert out.splitlines()[-1] == "placements and policies: identical; control: detected; gate: pass"


def test_validate_without_device_options_keys_its_hashes_by_policy_alone(capsys: pytest.CaptureFixture[str]) -> None:
    [got] = run_json(["validate", *VALIDATE, "--json", "--link-gbps", "50"], capsys)
    assert "placements" not in got and next(iter(got["hashes"])) == "flat" and got["identical"]


def test_validate_fails_when_one_placement_reads_a_shifted_window(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    real = validate_workload.serve

    def shifted(cfg: validate_workload.ValidateConfig, split: ferry.Backend, policy: str, shift: int = 0,
                compact: bool = False, prefetch: int = 0,
                layout: Optional[validate_workload.Layout] = None, **kw: Any) -> Tuple[str, int, int]:
        if layout is not None and layout.places == [None, 0, None, 1]:  # alternate on 2 devices
            shift = 1
        return real(cfg, split, policy, shift, compact, prefetch, layout, **kw)

    monkeypatch.setattr(validate_workload, "serve", shifted)
    assert main(["validate", *VALIDATE, "--json", "--devices", "2", "--layers", "4", "--policy", "ranges"]) == 1
    [got] = json.loads(capsys.readouterr().out)
    assert got["identical"] is False
    assert {k for k, h in got["hashes"].items() if h != got["hashes"]["one-device/ranges"]} == {
        "alternate/ranges", "alternate/ranges+overlap", "alternate/ranges+overlap-within"}


def test_validate_fails_when_device_memory_misses_a_write(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A write that never reaches a device-resident layer (here: dropped for device 1's memory)."""
    real = validate_workload.write_cells

    def dropped(kv: ferry.KVCache, which: str, layer: int, stream: int, cell0: int, data: bytes) -> None:
        place = kv.placement[layer]
        if place is None or not getattr(place, "_dropped", False):
            real(kv, which, layer, stream, cell0, data)

    made = DeviceConfig.make

    def make(self: DeviceConfig, kind: str) -> List[ferry.Backend]:
        devices = made(self, kind)
        devices[-1]._dropped = True  # type: ignore[attr-defined]
        return devices

    monkeypatch.setattr(validate_workload, "write_cells", dropped)
    monkeypatch.setattr(DeviceConfig, "make", make)
    assert main(["validate", *VALIDATE, "--json", "--devices", "2", "--layers", "2", "--policy", "ranges",
                 "--no-overlap"]) == 1
    [got] = json.loads(capsys.readouterr().out)
    bad = {k for k, h in got["hashes"].items() if h != got["hashes"]["one-device/ranges"]}
    assert bad == {p + "/ranges" for p, m in got["placements"].items() if "1" in m.split(",")}
    assert bad


@pytest.mark.parametrize("argv,message", [
    (["validate", "--devices", "3"], "--devices 3 with 2 layers: device 2 would run no layer and hold no KV"),
    (["bench", "--devices", "3"], "--devices 3 with 2 layers: device 2 would run no layer"),
    (["validate", "--devices", "2", "--layer-devices", "0,0"], "device 1 would run no layer and hold no KV: name it"),
    (["plan", "--residency", "--devices", "3", "--compute-us", "1"], "device 2 would run no layer"),
])
def test_a_device_with_nothing_to_do_is_refused(argv: List[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32, item 10: a device that runs no layer and holds no KV says so (exit 2)."""
    assert message in refused(argv, capsys)


def test_a_device_that_only_holds_kv_is_taken() -> None:
    DeviceConfig(n_devices=2, layer_devices=(0, 0), placement=(None, 1)).check(2, "cpu")

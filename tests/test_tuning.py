"""fp8dit.tuning: frozen data, each value with its measurement, varied only through override."""

import dataclasses
import re
import threading

import pytest

from fp8dit import tuning


def _entries(t: tuning.Tuning):
    for field in dataclasses.fields(t):
        value = getattr(t, field.name)
        if isinstance(value, tuning.Table):
            for k, v in value.items():
                if isinstance(v, tuning.Table):  # hip_tiles: by architecture, then head dim
                    yield from ((f"{field.name}[{k}][{k2}]", v2) for k2, v2 in v.items())
                else:
                    yield f"{field.name}[{k}]", v
        elif isinstance(value, tuple):
            yield from ((f"{field.name}[{i}]", v) for i, v in enumerate(value))
        else:
            yield field.name, value


def test_every_value_names_its_measurement():
    # (AMD and non-Hopper NVIDIA tiles: compiled for the architecture, said to be not yet
    # executed on it)
    dated = re.compile(r"(H200|H100|sm_90 SASS|CPU interpreter|compiled for gfx9\d\d with triton "
                       r"[\d.]+|compiled and checked for sm_\d+ with triton [\d.]+)"
                       r".*\b2026-\d\d-\d\d\b")
    for name, entry in _entries(tuning.DEFAULT):
        if isinstance(entry, tuning.Quantization):
            fields = {f.name for f in dataclasses.fields(entry)} - {"measured"}
            assert set(entry.measured) == fields, name
            reasons = list(entry.measured.values())
        elif isinstance(entry, tuning.VerifiedRelease):
            reasons = [f"{entry.gpu}, {entry.date}: {entry.measured}"]
        else:
            reasons = [entry.measured]
        for reason in reasons:
            assert dated.search(reason), (name, reason)
            assert not re.search(r"\bs\d+-\d+\b|session|\brun\b", reason), (name, reason)


def test_only_releases_run_on_a_gpu_are_verified():
    assert [(r.triton, r.gpu, r.date) for r in tuning.DEFAULT.gluon_releases] == [
        ("3.6", "NVIDIA H200", "2026-12-04"),
        ("3.8", "NVIDIA H100 80GB HBM3", "2026-12-06"),
        ("3.9", "NVIDIA H100 80GB HBM3", "2026-12-06")]
    for r in tuning.DEFAULT.gluon_releases:  # checked against fp64 and timed, each
        assert "fp64" in r.measured and re.search(r"faster|\d\.\d\dx", r.measured), r


def test_tables_are_frozen():
    t = tuning.DEFAULT
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.tiles = tuning.Table()
    with pytest.raises(TypeError):
        t.tiles[128] = t.tiles[64]
    with pytest.raises(AttributeError):
        t.tiles._items = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.tiles[128].block_n = 64
    assert t.tiles[128] == t.tiles.get(128) and 256 in t.tiles and 32 not in t.tiles
    assert t.tiles.get(32) is None and len(t.tiles) == 3 and sorted(t.tiles) == [64, 128, 256]


def test_override_changes_fields_for_its_block_only():
    before = tuning.current()
    assert before is tuning.DEFAULT
    with tuning.override(tiles={128: dict(block_n=64)},
                         quantization=dict(kv_rows={128: 128}, stats_warps=8)) as t:
        assert tuning.current() is t
        assert t.tiles[128].block_n == 64 and t.tiles[128].block_m == before.tiles[128].block_m
        assert t.tiles[64] == before.tiles[64]
        assert t.quantization.kv_rows[128] == 128 and t.quantization.kv_rows[64] == 64
        assert t.quantization.stats_warps == 8
        with tuning.override(gluon_releases=()) as inner:  # a tuple is replaced whole
            assert inner.gluon_releases == () and inner.tiles[128].block_n == 64
        assert tuning.current() is t

        seen = []  # process-wide: torch.compile traces current(), and dynamo before torch
        # 2.14 cannot trace a ContextVar or a thread-local
        worker = threading.Thread(target=lambda: seen.append(tuning.current()))
        worker.start()
        worker.join()
        assert seen == [t]
    assert tuning.current() is before
    assert tuning.DEFAULT.tiles[128].block_n == 128


def test_override_rejects_what_it_cannot_apply():
    with pytest.raises(TypeError, match="block_k"):
        with tuning.override(tiles={128: dict(block_k=64)}):
            pass
    with pytest.raises(KeyError, match="no entry 32"):
        with tuning.override(tiles={32: dict(block_n=64)}):
            pass
    with pytest.raises(TypeError, match="no_such_table"):
        with tuning.override(no_such_table={}):
            pass
    assert tuning.current() is tuning.DEFAULT


def test_unmeasured_nvidia_tiles_say_so_and_measured_archs_name_gpu_and_date():
    t = tuning.DEFAULT
    assert sorted(t.nvidia_tiles) == ["sm_100", "sm_120", "sm_89"]
    for arch, table in t.nvidia_tiles.items():
        assert sorted(table) == [64, 128, 256], arch
        for dp, tiles in table.items():
            assert tiles.measured.startswith(f"compiled and checked for {arch} with triton"), dp
            assert "not yet executed on the hardware" in tiles.measured, (arch, dp)
            assert tiles.maxnreg is None and tiles.waves_per_eu is None, (arch, dp)
    assert "sm_90" not in t.nvidia_tiles  # Hopper runs tuning.tiles, as measured
    assert list(t.measured_archs) == ["sm_90"]
    sm90 = t.measured_archs["sm_90"]
    assert "H200" in sm90.gpus and re.fullmatch(r"2026-\d\d-\d\d", sm90.date)

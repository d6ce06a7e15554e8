"""Saving and loading `neuron` tensors (`torch.save` / `torch.load` / pickle). Loading onto `neuron` segfaults in
plain torch 2.13 (no c10 allocator), so every load onto the device runs in a fresh interpreter."""

from __future__ import annotations

import pytest
import torch
from crash_support import run_checked

_SAVE = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to("neuron:1")
    base = torch.arange(6.0, device="neuron:1")
    checkpoint = {{
        "state": model.state_dict(),
        "base": base,
        "view": base[2:],  # shares base's storage
        "dtypes": [torch.ones(2, dtype=d, device="neuron") for d in
                   (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64, torch.uint8)],
        "scalar": torch.tensor(3.5, device="neuron"),
        "empty": torch.empty(0, 2, device="neuron"),
        "strided": torch.arange(12.0, device="neuron").reshape(3, 4).t(),
        "param": torch.nn.Parameter(torch.ones(2, device="neuron")),
    }}
    torch.save(checkpoint, {path!r}, _use_new_zipfile_serialization={zipfile})
"""

_CHECK = """
    import torch
    loaded = torch.load({path!r}, {load_args})
    expected_1, expected_0 = {expected_1!r}, {expected_0!r}
    base, view = loaded["base"], loaded["view"]
    assert base.device == torch.device(expected_1), base.device
    assert base.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert view.untyped_storage() is base.untyped_storage() and view.storage_offset() == 2
    base[2] = 100.0
    assert view[0].item() == 100.0
    state = loaded["state"]
    assert state["0.weight"].shape == (4, 3) and state["1.running_var"].tolist() == [1.0] * 4
    assert all(t.device == torch.device(expected_1) for t in state.values())
    for t, d in zip(loaded["dtypes"], (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64,
                                        torch.uint8)):
        assert t.dtype == d and t.device == torch.device(expected_0) and t.tolist() == [1, 1], (t, d)
    assert loaded["scalar"].item() == 3.5 and loaded["scalar"].dim() == 0
    assert loaded["empty"].shape == (0, 2) and loaded["empty"].device == torch.device(expected_0)
    strided = loaded["strided"]
    assert strided.stride() == (1, 4) and torch.equal(strided.cpu(), torch.arange(12.0).reshape(3, 4).t())
    assert isinstance(loaded["param"], torch.nn.Parameter) and loaded["param"].requires_grad
    print("OK")
"""


def _save(path, *, zipfile: bool = True) -> None:
    run_checked(_SAVE.format(path=str(path), zipfile=zipfile))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    _save(path)
    return path


@pytest.mark.parametrize(
    ("load_args", "expected_1", "expected_0"),
    [
        ("", "neuron:1", "neuron:0"),  # the default: back where it was saved
        ("weights_only=True", "neuron:1", "neuron:0"),
        ("weights_only=False", "neuron:1", "neuron:0"),
        ("map_location='neuron'", "neuron:0", "neuron:0"),
        ("map_location='neuron:2'", "neuron:2", "neuron:2"),
        ("map_location=torch.device('neuron', 3), weights_only=True", "neuron:3", "neuron:3"),
        ("map_location={'neuron:1': 'neuron:2'}", "neuron:2", "neuron:0"),
        ("map_location=lambda storage, location: storage.to(device='neuron:3')", "neuron:3", "neuron:3"),
        ("map_location='cpu'", "cpu", "cpu"),
        ("map_location='cpu', weights_only=True", "cpu", "cpu"),
        ("map_location='neuron', mmap=True", "neuron:0", "neuron:0"),
    ],
)
def test_load_neuron_checkpoint(checkpoint, load_args, expected_1, expected_0):
    assert "OK" in run_checked(
        _CHECK.format(path=str(checkpoint), load_args=load_args, expected_1=expected_1, expected_0=expected_0)
    )


def test_legacy_format_loads_onto_neuron(tmp_path):
    """The pre-zipfile format (also what pickling a storage uses) reads the bytes into the restored storage."""
    path = tmp_path / "legacy.pt"
    _save(path, zipfile=False)
    check = _CHECK.format(path=str(path), load_args="weights_only=False", expected_1="neuron:1", expected_0="neuron:0")
    assert "OK" in run_checked(check)


def test_cpu_checkpoint_loads_onto_neuron(tmp_path):
    path = tmp_path / "cpu.pt"
    torch.save({"w": torch.arange(4.0), "i": torch.arange(3)}, path)
    run_checked(f"""
        import torch
        before = torch.neuron.memory_allocated(1)
        loaded = torch.load({str(path)!r}, map_location="neuron:1", weights_only=True)
        assert loaded["w"].device == torch.device("neuron:1") and loaded["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert loaded["i"].dtype == torch.int64 and loaded["i"].tolist() == [0, 1, 2]
        assert torch.neuron.memory_allocated(1) >= before + 16 + 24  # the loaded storages live on the device
        del loaded
        assert torch.neuron.memory_allocated(1) == before
    """)


def test_saved_storages_are_tagged_with_their_device(tmp_path):
    path = tmp_path / "tagged.pt"
    run_checked(f"""
        import torch
        torch.save([torch.ones(2, device="neuron:2")], {str(path)!r})
        assert torch.serialization.location_tag(torch.ones(1, device="neuron:1").untyped_storage()) == "neuron:1"
    """)
    # Without the device (map_location='cpu') the data still loads, in this process with no neuron load at all.
    assert torch.load(path, map_location="cpu")[0].tolist() == [1.0, 1.0]


def test_load_onto_missing_device_is_a_clear_error(checkpoint):
    run_checked(f"""
        import torch
        count = torch.neuron.device_count()
        for location in (f"neuron:{{count}}", {{"neuron:1": f"neuron:{{count}}"}}):
            try:
                torch.load({str(checkpoint)!r}, map_location=location)
            except RuntimeError as e:
                assert f"device_count() is {{count}}" in str(e) and "map_location" in str(e), str(e)
            else:
                raise AssertionError("loaded onto a missing device")
    """)


def test_pickle_round_trip_and_state_dict_into_module():
    run_checked("""
        import io, pickle
        import torch
        t = torch.arange(4.0, device="neuron:1")[1:]
        back = pickle.loads(pickle.dumps(t))
        assert back.device == torch.device("neuron:1") and back.tolist() == [1.0, 2.0, 3.0]
        model = torch.nn.Linear(2, 2).to("neuron")
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        fresh = torch.nn.Linear(2, 2).to("neuron")
        fresh.load_state_dict(torch.load(buffer))
        assert torch.equal(fresh.weight.detach().cpu(), model.weight.detach().cpu())
        assert fresh.weight.device.type == "neuron"
        x = torch.randn(3, 2, device="neuron")
        assert torch.equal(fresh(x).detach().cpu(), model(x).detach().cpu())
    """)

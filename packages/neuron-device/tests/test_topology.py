"""The simulated machine (`neuron_device.topology`): targets, chips, logical cores, visible cores, HBM per device."""

from __future__ import annotations

import pytest
import torch  # noqa: F401  -- torch first: it autoloads neuron_device

from neuron_device.topology import GiB, parse_size, read_topology

MiB = 1024**2


def test_default_is_one_trn2_chip_with_four_logical_cores():
    topo = read_topology({})
    assert (topo.target.name, topo.chips, topo.lnc, topo.device_count) == ("trn2", 1, 2, 4)
    assert topo.visible == (0, 1, 2, 3)
    assert topo.hbm_bytes_per_device == 24 * GiB
    assert topo.instance_type is None


@pytest.mark.parametrize(
    ("env", "devices", "memory"),
    [
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1"}, 2, 16 * GiB),
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "1"}, 8, 12 * GiB),
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "TRN3"}, 4, 36 * GiB),
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3", "NEURON_LOGICAL_NC_CONFIG": "1"}, 8, 18 * GiB),
    ],
)
def test_target_and_lnc_set_devices_and_hbm_share(env, devices, memory):
    topo = read_topology(env)
    assert topo.device_count == devices
    assert topo.hbm_bytes_per_device == memory
    assert topo.hbm_bytes_per_device * topo.logical_cores_per_chip == topo.target.hbm_bytes_per_chip


def test_instance_type_sets_chips_and_target():
    topo = read_topology({"NEURON_SIM_INSTANCE_TYPE": "trn2.48xlarge"})
    assert (topo.target.name, topo.chips, topo.device_count) == ("trn2", 16, 64)
    assert topo.instance_type == "trn2.48xlarge"
    trn1 = read_topology({"NEURON_SIM_INSTANCE_TYPE": "trn1.32xlarge"})
    assert (trn1.target.name, trn1.chips, trn1.device_count) == ("trn1", 16, 32)
    assert read_topology({"NEURON_SIM_INSTANCE_TYPE": "trn2.3xlarge"}).device_count == 4


def test_chips_count_for_any_target():
    topo = read_topology({"NEURON_SIM_CHIPS": "2", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"})
    assert (topo.chips, topo.device_count) == (2, 8)
    consistent = {"NEURON_SIM_CHIPS": "16", "NEURON_SIM_INSTANCE_TYPE": "trn2.48xlarge"}
    assert read_topology(consistent).chips == 16


def test_core_ids_chips_and_physical_cores():
    topo = read_topology({"NEURON_SIM_CHIPS": "2", "NEURON_RT_VISIBLE_CORES": "3-5"})
    assert topo.visible == (3, 4, 5)
    assert [topo.core_id(i) for i in range(3)] == [3, 4, 5]
    assert [topo.chip_of(i) for i in range(3)] == [0, 1, 1]
    assert [topo.physical_cores_of(i) for i in range(3)] == [(6, 7), (0, 1), (2, 3)]
    assert read_topology({"NEURON_LOGICAL_NC_CONFIG": "1"}).physical_cores_of(5) == (5,)


@pytest.mark.parametrize(
    ("value", "visible"),
    [("2", (2,)), ("0-3", (0, 1, 2, 3)), ("1,5", (1, 5)), (" 5 , 0-1 ", (0, 1, 5)), ("7", (7,))],
)
def test_visible_cores_forms(value, visible):
    env = {"NEURON_RT_VISIBLE_CORES": value, "NEURON_LOGICAL_NC_CONFIG": "1"}
    topo = read_topology(env)
    assert topo.visible == visible
    assert topo.device_count == len(visible)


def test_num_cores_takes_the_first_cores():
    assert read_topology({"NEURON_RT_NUM_CORES": "2"}).visible == (0, 1)
    assert read_topology({"NEURON_RT_NUM_CORES": "0"}).visible == (0, 1, 2, 3)
    both = {"NEURON_RT_NUM_CORES": "2", "NEURON_RT_VISIBLE_CORES": "2-3"}
    assert read_topology(both).visible == (2, 3)


def test_device_memory_override():
    assert read_topology({"NEURON_SIM_DEVICE_MEMORY": "512MiB"}).hbm_bytes_per_device == 512 * MiB
    assert read_topology({"NEURON_SIM_DEVICE_MEMORY": "1048576"}).hbm_bytes_per_device == MiB
    assert parse_size("1.5GiB", "X") == 3 * GiB // 2
    assert parse_size("2 GB", "X") == 2 * 10**9


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn9"}, ["NEURON_PLATFORM_TARGET_OVERRIDE='trn9'", "trn1", "trn3"]),
        ({"NEURON_LOGICAL_NC_CONFIG": "4"}, ["NEURON_LOGICAL_NC_CONFIG='4'", "1 or 2 on trn2"]),
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1", "NEURON_LOGICAL_NC_CONFIG": "2"}, ["'2'", "1 on trn1"]),
        ({"NEURON_SIM_INSTANCE_TYPE": "p5.48xlarge"}, ["NEURON_SIM_INSTANCE_TYPE", "trn2.48xlarge"]),
        ({"NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}, ["contradicts"]),
        ({"NEURON_SIM_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_SIM_CHIPS": "2"}, ["NEURON_SIM_CHIPS=2", "16"]),
        ({"NEURON_SIM_CHIPS": "0"}, ["NEURON_SIM_CHIPS='0'", "positive"]),
        ({"NEURON_SIM_CHIPS": "two"}, ["NEURON_SIM_CHIPS='two'"]),
        ({"NEURON_RT_VISIBLE_CORES": "4"}, ["NEURON_RT_VISIBLE_CORES='4'", "core 4 does not exist", "0 to 3"]),
        ({"NEURON_RT_VISIBLE_CORES": "3-1"}, ["reversed", "'0-3'"]),
        ({"NEURON_RT_VISIBLE_CORES": "1,1"}, ["listed twice"]),
        ({"NEURON_RT_VISIBLE_CORES": ""}, ["NEURON_RT_VISIBLE_CORES=''", "neither a core id nor a range"]),
        ({"NEURON_RT_VISIBLE_CORES": "a-b"}, ["'a-b' is neither"]),
        ({"NEURON_RT_NUM_CORES": "5"}, ["NEURON_RT_NUM_CORES='5'", "0 (all) to 4"]),
        ({"NEURON_RT_NUM_CORES": "-1"}, ["NEURON_RT_NUM_CORES='-1'"]),
        ({"NEURON_RT_NUM_CORES": "1", "NEURON_RT_VISIBLE_CORES": "0-1"}, ["asks for 1 cores", "lists 2"]),
        ({"NEURON_SIM_DEVICE_MEMORY": "lots"}, ["NEURON_SIM_DEVICE_MEMORY='lots'", "MiB"]),
        ({"NEURON_SIM_DEVICE_MEMORY": "3 parsecs"}, ["NEURON_SIM_DEVICE_MEMORY"]),
        ({"NEURON_SIM_DEVICE_MEMORY": "0"}, ["not a positive memory size"]),
    ],
)
def test_invalid_values_name_the_variable_and_the_accepted_forms(env, fragments):
    with pytest.raises(RuntimeError) as info:
        read_topology(env)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_environment_drives_torch_neuron(python):
    code = """
import torch
props = [torch.neuron.get_device_properties(i) for i in range(torch.neuron.device_count())]
print(torch.neuron.device_count(), torch.accelerator.device_count())
print([(p.name, p.core_id, p.chip, p.total_memory) for p in props])
print(torch.neuron.mem_get_info(1))
"""
    env = {"NEURON_SIM_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_RT_VISIBLE_CORES": "1,5",
           "NEURON_SIM_DEVICE_MEMORY": "1GiB"}
    result = python(code, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "2 2"
    assert lines[1] == str([("trn2", 1, 0, GiB), ("trn2", 5, 1, GiB)])
    assert lines[2] == str((GiB, GiB))


def test_bad_environment_fails_at_first_use(python):
    result = python("import torch; torch.ones(1, device='neuron')", env={"NEURON_RT_VISIBLE_CORES": "0-9"})
    assert result.returncode != 0
    assert "NEURON_RT_VISIBLE_CORES='0-9' is invalid" in result.stderr

"""`neuron-plan --serve`: a serving script planned at each batch size, the throughput/latency curve and the largest
batch that fits (`plan_serve`)."""

import json
import os
import subprocess
import sys

import pytest
from launcher import WORKERS

from neuron_distributed import plan_cli


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-m", "neuron_distributed.plan_cli", "--serve", *args],
                          capture_output=True, text=True, timeout=900, check=False, env=dict(os.environ))


@pytest.mark.slow
@pytest.mark.optional
def test_serve_sweep_prints_the_curve_and_the_largest_batch_that_fits(tmp_path):
    """Batches 1, 2 and 4 of a static cache of 4 GiB a sequence on trn1.2xlarge (16 GiB a core): each batch's TTFT,
    TPOT and throughput; 1 and 2 fit, 4 does not, and the sweep names where it runs out (the cache's allocation)."""
    pytest.importorskip("transformers")
    out = tmp_path / "serve.json"
    done = _serve("--batch", "4,1,2", "--instance", "trn1.2xlarge", "--json", str(out), "--", "python",
                  str(WORKERS / "plan" / "serve_batches.py"), "--batch", "{batch}")
    assert done.returncode == 0, done.stderr[-3000:]
    serve = json.loads(out.read_text())["serve"]
    points = serve["points"]
    assert [p["batch_size"] for p in points] == [1, 2, 4]
    assert [p["fits"] for p in points] == [True, True, False]
    assert serve["largest_batch_that_fits"] == 2 and serve["smallest_batch_that_does_not_fit"] == 4
    assert "lazy_initialization" in serve["runs_out_at"]["code"]
    for point in points:
        assert point["kv_cache_bytes"] == point["batch_size"] * 4 * 2**30
        assert point["output_tokens"] == 3
        assert point["output_tokens_per_second"] == pytest.approx(point["batch_size"] / point["tpot_seconds"])
        assert point["ttft_seconds"] > point["tpot_seconds"] > 0
    # a larger batch: more output tokens a second in all, fewer for each sequence
    assert points[1]["output_tokens_per_second"] > points[0]["output_tokens_per_second"]
    assert points[1]["output_tokens_per_second_per_sequence"] < points[0]["output_tokens_per_second_per_sequence"]
    assert "largest batch that fits: 2" in done.stdout
    assert "batch 4 does not fit: out of HBM at" in done.stdout


@pytest.mark.parametrize(("argv", "message"), [
    (["--serve", "--batch", "1,2", "--", "python", "serve.py", "--batch", "8"], "has none"),
    (["--serve", "--batch", "1,x", "--", "python", "serve.py", "--batch", "{batch}"], "not a list of batch sizes"),
    (["--serve", "--batch", "0", "--", "python", "serve.py", "--batch", "{batch}"], "at least 1"),
])
def test_serve_refuses_a_sweep_it_cannot_run(argv, message):
    """Before planning anything: a command without `{batch}` and batch sizes that are not positive integers."""
    with pytest.raises(SystemExit, match=message):
        plan_cli.main(argv)

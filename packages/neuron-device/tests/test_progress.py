"""progress(): a self-erasing line on terminals, nothing at all elsewhere."""

from __future__ import annotations

import io

from neuron_device.progress import PROGRESS_ENV, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_writes_nothing():
    stream = io.StringIO()
    assert list(progress(range(5), "compiling", stream=stream)) == [0, 1, 2, 3, 4]
    assert stream.getvalue() == ""


def test_terminal_shows_counts_and_erases_the_line():
    stream = _Terminal()
    assert list(progress([10, 20, 30], "compiling graphs", stream=stream, min_interval=0)) == [10, 20, 30]
    out = stream.getvalue()
    assert [f"compiling graphs: {n}/3" in out for n in range(4)] == [True] * 4
    assert "\n" not in out
    assert out.endswith("\r" + " " * len("compiling graphs: 3/3") + "\r")


def test_unsized_iterables_count_without_a_total():
    stream = _Terminal()
    list(progress(iter("ab"), "layers", stream=stream, min_interval=0))
    assert "layers: 2" in stream.getvalue() and "/" not in stream.getvalue()


def test_env_var_turns_it_off(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    stream = _Terminal()
    assert list(progress(range(3), "x", stream=stream, min_interval=0)) == [0, 1, 2]
    assert stream.getvalue() == ""


def test_the_line_is_erased_when_the_loop_breaks():
    stream = _Terminal()
    iterator = progress(range(10), "x", stream=stream, min_interval=0)
    next(iterator)
    iterator.close()
    assert stream.getvalue().endswith("\r")

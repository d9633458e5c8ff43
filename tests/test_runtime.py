"""What a run records about how it ran: the thread count `threads=auto` picks and the `runtime` record."""

import os

import pytest
import torch

from specbench.common.options import OptionError
from specbench.runs import runner


@pytest.mark.parametrize("cpus,load,expected", [(2, 0.3, 2), (2, 1.2, 1), (2, 1.6, 1), (2, 4.0, 1), (16, 5.4, 11)])
def test_auto_threads_are_the_cpus_not_already_busy(monkeypatch, cpus, load, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    old = torch.get_num_threads()
    try:
        assert runner.free_cpus() == expected
        assert runner.set_threads("auto") == expected == torch.get_num_threads()
        assert runner.set_threads(3) == 3  # an explicit number wins
        assert runner.set_threads(None) == 3  # null: left as torch has it
        with pytest.raises(OptionError, match="threads must be auto"):
            runner.set_threads("all")
    finally:
        torch.set_num_threads(old)

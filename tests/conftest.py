"Shared pytest set-up."
import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    "Tiny models run several times faster on one thread than on two contended cores (measured); restored afterwards."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

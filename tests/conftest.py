import lpes_nb  # noqa: F401  (first: decides bf16 safety before torch loads, lpes_nb.system.machine)
import pytest
import torch

from lpes_nb.store.models import EMBEDDED, load_model, load_tokenizer

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def smollm2():
    return load_model(EMBEDDED)


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma3"])
def tiny(request):
    return load_model(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model("tiny-llama")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def qwen():
    from lpes_nb.store.models import QWEN

    return load_model(QWEN)

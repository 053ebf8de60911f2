"""The torch model on the embedded Gemma 3 270M GGUF against llama.cpp on the same file.

Ours runs on weights dequantised to float32; llama.cpp multiplies with the quantised blocks
(and quantises activations to 8 bits on the way), so logits cannot match exactly. We require
the same next token on every prompt and a logit correlation of at least 0.995 (measured here:
0.9989 to 0.9996).
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")


from openjarvis.errors import UserError  # noqa: E402
from openjarvis.runtime.models import resolve_model  # noqa: E402
from openjarvis.runtime.torch.config import TorchSettings  # noqa: E402
from openjarvis.runtime.torch.engine import TorchEngine  # noqa: E402
from openjarvis.runtime.torch.loading import load_gguf  # noqa: E402
from openjarvis.runtime.types import GenerationRequest  # noqa: E402

MIN_CORRELATION = 0.995
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, there was a",
    "1, 2, 3, 4, 5,",
]


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    return resolve_model(None).path


@pytest.fixture(scope="module")
def engine(gemma_path: Path) -> Iterator[TorchEngine]:
    engine = TorchEngine(gemma_path, TorchSettings(device="cpu", max_seq_len=128))
    yield engine
    engine.close()


def test_gguf_config_is_gemma3(engine: TorchEngine) -> None:
    config = engine.config
    assert (config.n_layers, config.dim, config.n_heads, config.n_kv_heads) == (18, 640, 4, 1)
    assert config.is_sliding(0) and not config.is_sliding(5)
    assert config.sliding_window == 512 and config.tie_embeddings


def test_next_token_matches_llama_cpp(engine: TorchEngine, gemma_path: Path) -> None:
    reference = llama_cpp.Llama(
        model_path=str(gemma_path), n_ctx=128, logits_all=True, n_threads=2, verbose=False
    )
    assert engine.tokenizer is not None
    try:
        for prompt in PROMPTS:
            tokens = reference.tokenize(prompt.encode(), True, False)
            assert engine.tokenizer.encode(prompt) == tokens
            reference.reset()
            reference.eval(tokens)
            expected = np.array(reference.scores[len(tokens) - 1])
            ours = engine.logits(tokens)[-1].numpy()
            correlation = np.corrcoef(expected, ours)[0, 1]
            assert ours.argmax() == expected.argmax(), prompt
            assert correlation >= MIN_CORRELATION, f"{prompt!r}: correlation {correlation:.4f}"
    finally:
        reference.close()


def test_generate_times_tokens_and_honours_stop_sequences(engine: TorchEngine) -> None:
    free = engine.generate(GenerationRequest("Once upon a time, there was a", max_tokens=12))
    assert free.completion_tokens == 12 and free.finish_reason == "length"
    assert free.text.strip()
    assert free.ttft_s is not None and free.decode_s is not None and free.decode_s > 0
    assert free.decode_tokens_per_s is not None and free.decode_bytes_per_token
    # Stop at the second word of the free-running text: the text ends before it.
    words = free.text.split()
    assert len(words) >= 2
    stopped = engine.generate(
        GenerationRequest("Once upon a time, there was a", max_tokens=12, stop=(words[1],))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(words[1])]
    assert stopped.completion_tokens < free.completion_tokens


def test_cpu_bandwidth_is_unknown_not_zero_and_so_is_the_mbu(engine: TorchEngine) -> None:
    assert engine.bandwidth_bytes_per_s is None
    assert engine.settings_dict()["memory_bandwidth_gb_per_s"] is None
    completion = engine.generate(GenerationRequest("1, 2, 3,", max_tokens=3))
    assert completion.memory_bandwidth_utilisation is None


def test_no_max_tokens_runs_to_the_end_of_the_context(engine: TorchEngine) -> None:
    # max_tokens None once reached `len(prompt) + None` (a TypeError), as mypy found.
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    context = engine.config.max_seq_len

    def prompt_of(tokens: int) -> str:  # a prompt of about that many tokens
        words = 1
        while len(tokenizer.encode("one " * (words + 1))) <= tokens:
            words += 1
        return "one " * words

    prompt = prompt_of(context - 4)  # a few tokens left: a short test on the CPU
    completion = engine.generate(GenerationRequest(prompt, max_tokens=None))
    used = completion.prompt_tokens + completion.completion_tokens
    assert completion.completion_tokens > 0 and used <= context
    assert completion.finish_reason == "stop" or used == context
    with pytest.raises(UserError, match="fills the context"):
        engine.generate(GenerationRequest("one " * context, max_tokens=None))


def test_sampling_is_reproducible_from_its_seed_and_differs_from_greedy(
    engine: TorchEngine,
) -> None:
    """Temperature above 0 draws from the model's distribution (an OpenAI client sends 1.0 by
    default): the same seed gives the same text, other seeds other texts."""
    prompt = "Write a short story about a robot:"

    def text(temperature: float, seed: int | None) -> str:
        request = GenerationRequest(prompt, max_tokens=16, temperature=temperature, seed=seed)
        return engine.generate(request).text

    greedy = text(0.0, None)
    first = text(1.0, 7)
    assert text(1.0, 7) == first
    others = {text(1.0, seed) for seed in (8, 9, 10)}
    assert len(others | {first}) > 1, "four seeds gave one text: not sampling"
    assert any(sample != greedy for sample in others | {first})


def test_a_gguf_cut_inside_its_weights_is_one_clear_error(gemma_path: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with gemma_path.open("rb") as whole:
        cut.write_bytes(whole.read(20 * 1024 * 1024))  # the header and some tensors
    with pytest.raises(UserError, match=r"cut.gguf ends inside tensor .*re-download"):
        load_gguf(cut)


@pytest.mark.parametrize(
    ("kind", "message"),
    [(26, r"w of .* is of type I32, which the torch engine cannot read"), (999, r"unknown type")],
    ids=["integer", "unknown"],
)
def test_a_tensor_type_the_loader_cannot_read_is_named_before_any_weight_is_read(
    kind: int, message: str
) -> None:
    import gguf

    from openjarvis.runtime.gguf import GgufHeader, GgufTensor
    from openjarvis.runtime.torch.loading import _tensor_kinds

    header = GgufHeader(
        3, {}, {}, {"norm": GgufTensor((8,), 0, 0), "w": GgufTensor((8,), kind, 32)}
    )
    with pytest.raises(UserError, match=message):
        _tensor_kinds(gguf, header, Path("model.gguf"))
    readable = GgufHeader(3, {}, {}, {"q": GgufTensor((32,), 12, 0)})  # Q4_K
    assert _tensor_kinds(gguf, readable, Path("m.gguf")) == {"q": gguf.GGMLQuantizationType.Q4_K}

"""One-row decode steps through the persistent layer kernel (runtime/torch/one_row.py) against
the model's own modules: the same hidden state after the final norm, the same key and value in
the row's slot, the rest of the cache untouched. On a GPU in bf16, as one launch a layer and
as five (`-m gpu`); on the CPU under TRITON_INTERPRET=1 in float32, five launches a layer (the
interpreter runs programs one after another: a barrier would wait forever)."""

import pytest

pytest.importorskip("torch")

from collections.abc import Callable
from dataclasses import replace

import torch

from openjarvis.runtime.torch.model import ModelConfig, Transformer, TransformerBlock, config_for
from openjarvis.runtime.torch.paged import Layout, slots_of
from tests.kernels.triton_device import KERNEL_MARKS, Tolerance, kernel_device

pytestmark = KERNEL_MARKS

BLOCK_SIZE = 16


def _model(preset: "str | ModelConfig", device: str, dtype: "torch.dtype") -> Transformer:
    torch.manual_seed(0)
    model = Transformer(config_for(preset) if isinstance(preset, str) else preset)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # norms: away from their identity
                parameter.normal_(0.0, 0.3)
    model = model.to(device=device, dtype=dtype)
    model.init_buffers()
    model.setup_caches(12, BLOCK_SIZE, dtype)
    return model


def _cache_tensors(model: Transformer) -> list["torch.Tensor"]:
    tensors: list[torch.Tensor] = []
    for layer in model.layers:
        assert isinstance(layer, TransformerBlock)
        cache = layer.attention.kv_cache
        assert cache is not None, "the model's caches are set up"
        tensors += [cache.k, cache.v]
    return tensors


def _caches(model: Transformer) -> list["torch.Tensor"]:
    return [t.clone() for t in _cache_tensors(model)]


def _restore(model: Transformer, caches: list["torch.Tensor"]) -> None:
    for target, saved in zip(_cache_tensors(model), caches, strict=True):
        target.copy_(saved)


def _against_the_model(
    model: Transformer,
    tokens: "torch.Tensor",
    table: "torch.Tensor",
    step: Callable[..., "torch.Tensor"],
) -> tuple["torch.Tensor", "torch.Tensor", list["torch.Tensor"], list["torch.Tensor"]]:
    """The prompt (all of `tokens` [1, T] but the last) prefilled through `table`, then the
    last token's step by `step` and by the model's own modules from the same cache: their
    hidden states after the final norm, and the caches after each."""
    device = tokens.device
    prompt = tokens.size(1) - 1
    positions = torch.arange(prompt + 1, device=device).view(1, -1)
    slots = slots_of(table, positions, BLOCK_SIZE)
    with torch.no_grad():
        model(tokens[:, :prompt], Layout(positions[:, :prompt], slots[:, :prompt], table))
        before = _caches(model)
        row = (tokens[:, prompt:], positions[:, prompt:], slots[:, prompt:], table)
        expected = model.norm(model.hidden(row[0], Layout(*row[1:]))[:, -1])
        expected_caches = _caches(model)
        _restore(model, before)
        got = step(*row)
    return got, expected, _caches(model), expected_caches


def _tolerance(dtype: "torch.dtype") -> Tolerance:
    """bf16 on a GPU, rounded in other orders; float32 under the interpreter."""
    bound = 3e-2 if dtype == torch.bfloat16 else 1e-4
    return {"atol": bound, "rtol": bound}


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("prompt", [1, 21, 100])
@pytest.mark.parametrize(
    ("phases", "programs", "pdl"),
    # Under the interpreter two programs (at 100 positions one part a KV head of two tiles) or
    # five (two parts a head, combined; one program without a part); on a GPU one a
    # multiprocessor, and the five launches also with programmatic dependent launch.
    [(True, 2, False), (True, 5, False), (False, 0, False), (True, 0, True)],
)
def test_one_row_step_gives_the_models_hidden_state_and_cache(
    preset: str, prompt: int, phases: bool, programs: int, pdl: bool
) -> None:
    from openjarvis.kernels.decode_layer import PHASES
    from openjarvis.runtime.torch.one_row import OneRowStep, supported

    device = kernel_device()
    assert device is not None
    if device == "cpu" and (not phases or pdl):
        pytest.skip("one launch a layer waits at barriers, PDL waits for launches: GPU only")
    from openjarvis.kernels.decode_layer import gdc_wait

    if pdl and gdc_wait is None:
        pytest.skip("this Triton has no grid dependency controls")
    if device == "cuda":
        if programs == 5:
            pytest.skip("on a GPU the grid is the multiprocessors: the (True, 2) case")
        programs = torch.cuda.get_device_properties(0).multi_processor_count
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _model(preset, device, dtype)
    assert supported(model) is None
    generator = torch.Generator().manual_seed(prompt)
    blocks = torch.randperm(11, generator=generator)[:8] + 1  # block 0 left as scratch
    table = blocks.to(torch.int32).view(1, -1).to(device)
    tokens = torch.randint(0, model.config.vocab_size, (1, prompt + 1), generator=generator)
    tokens = tokens.to(device)
    launches = tuple(range(1, PHASES + 1)) if phases else (0,)
    step = OneRowStep(model, programs, phases=launches, pdl=pdl)
    got, expected, got_caches, expected_caches = _against_the_model(model, tokens, table, step)
    tolerance = _tolerance(dtype)
    torch.testing.assert_close(got, expected, **tolerance)
    for got_cache, expected_cache in zip(got_caches, expected_caches, strict=True):
        torch.testing.assert_close(got_cache, expected_cache, **tolerance)


@pytest.mark.parametrize(
    ("combine", "most_tile", "programs"),
    # Parts combined 1, 2 or 4 a load; then tiles of one feature, several a program (each
    # next one loaded while this one is multiplied: `AHEAD`), on three programs.
    [(1, None, 12), (2, None, 12), (4, None, 12), (1, 16, 3)],
)
def test_attention_parts_and_tiles_several_a_program_give_the_same_step(
    combine: int, most_tile: int | None, programs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys in tiles of 16: at 100 positions over 12 programs each of the two KV heads has six
    programs and four parts of 32 keys, combined one, two or four a load (masked past the
    fourth); three query heads a KV head (a group padded to four, as Llama 3.2 3B's): the
    model's hidden state either way."""
    from openjarvis.kernels import decode_layer
    from openjarvis.runtime.torch.one_row import OneRowStep, kernel_constants

    monkeypatch.setattr(decode_layer, "_TILE", 16)
    monkeypatch.setattr(decode_layer, "_COMBINE", combine)
    if most_tile is not None:
        monkeypatch.setattr(decode_layer, "_MOST_TILE", most_tile)
    device = kernel_device()
    assert device is not None
    if device == "cuda":
        programs = torch.cuda.get_device_properties(0).multi_processor_count
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _model(replace(config_for("tiny-llama"), n_heads=6), device, dtype)
    assert model.config.n_kv_heads == 2
    constants = kernel_constants(model.config, block=BLOCK_SIZE, programs=programs)
    assert constants["AHEAD"] == (most_tile is not None)
    table = torch.arange(1, 9, dtype=torch.int32, device=device).view(1, -1)
    tokens = torch.randint(0, model.config.vocab_size, (1, 101), device=device)  # 100 cached
    got, expected, _, _ = _against_the_model(model, tokens, table, OneRowStep(model, programs))
    torch.testing.assert_close(got, expected, **_tolerance(dtype))


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "llama-3-8b"])
def test_wide_rows_several_tiles_a_program_give_the_models_hidden_state(preset: str) -> None:
    """Two layers of a real shape whose rows (8,192 and 14,336 features) leave each program
    a few rows a tile and several tiles a phase, as the engine runs them (five launches, then
    with programmatic dependent launch): the model's hidden state and cache. GPU only: the
    interpreter takes minutes a layer at these sizes."""
    from openjarvis.kernels.decode_layer import gdc_wait
    from openjarvis.runtime.torch.one_row import OneRowStep, supported

    if kernel_device() != "cuda":
        pytest.skip("a real shape's layers: GPU only")
    config = replace(config_for(preset), n_layers=2, vocab_size=512, max_seq_len=256)
    model = _model(config, "cuda", torch.bfloat16)
    assert supported(model) is None
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    table = torch.arange(1, 9, dtype=torch.int32, device="cuda").view(1, -1)
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, config.vocab_size, (1, 101), generator=generator).to("cuda")
    for pdl in (False, True) if gdc_wait is not None else (False,):
        step = OneRowStep(model, programs, pdl=pdl)
        got, expected, got_caches, expected_caches = _against_the_model(model, tokens, table, step)
        torch.testing.assert_close(got, expected, **_tolerance(torch.bfloat16))
        for got_cache, expected_cache in zip(got_caches, expected_caches, strict=True):
            torch.testing.assert_close(got_cache, expected_cache, **_tolerance(torch.bfloat16))

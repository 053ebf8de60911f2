"""model.py against transformers' own implementation of the same config and the same random
weights, loaded through our safetensors loader; tolerances are for float32 on CPU."""

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import transformers

from openjarvis.runtime.torch.loading import build_model, load_hf
from openjarvis.runtime.torch.model import ModelConfig, Transformer, config_for
from openjarvis.runtime.torch.paged import Layout, row_joins, slots_of

# float32 on both sides, but different operation orders (SDPA vs eager softmax, fused RoPE):
# differences stay near 1e-5 of the logits' scale; 1e-4 leaves room for other CPUs.
RELATIVE_TOLERANCE = 1e-4


def _hf_model(config: ModelConfig) -> "transformers.PreTrainedModel":
    # Keyword arguments every config class takes: ints, a float and a bool
    common: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.norm_eps,
        "max_position_embeddings": config.max_seq_len,
        "tie_word_embeddings": config.tie_embeddings,
    }
    hf_config: transformers.PreTrainedConfig
    build: Callable[[], transformers.PreTrainedModel]  # the model class on its own config
    if config.name == "tiny-llama":
        hf_config = transformers.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": config.rope_base}
        )
        build = partial(transformers.LlamaForCausalLM, hf_config)
    elif config.name == "tiny-qwen3":
        hf_config = transformers.Qwen3Config(
            **common, rope_parameters={"rope_type": "default", "rope_theta": config.rope_base}
        )
        build = partial(transformers.Qwen3ForCausalLM, hf_config)
    else:
        assert config.query_scale is not None and config.sliding_window is not None
        hf_config = transformers.Gemma3TextConfig(
            **common,
            query_pre_attn_scalar=round(config.query_scale**-2),
            sliding_window=config.sliding_window,
            layer_types=[
                "sliding_attention" if config.is_sliding(i) else "full_attention"
                for i in range(config.n_layers)
            ],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": config.rope_base},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
        build = partial(transformers.Gemma3ForCausalLM, hf_config)
    hf_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():  # trained-like norm weights, not the initial constants
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.2)
                if config.norm_weight_offset == 0.0:
                    parameter.add_(1.0)
    return model


BLOCK = 4  # small blocks, so that a prompt spans several (in reverse order: see _layout)


def _paged(model: Transformer, rows: int) -> None:
    blocks_per_row = -(-model.config.max_seq_len // BLOCK)
    model.setup_caches(1 + rows * blocks_per_row, BLOCK, torch.float32)


def _layout(model: Transformer, rows: int, positions: torch.Tensor) -> Layout:
    """Row b owns its own run of blocks, listed backwards in its table: block order in the
    cache must not matter, only the table."""
    width = -(-model.config.max_seq_len // BLOCK)
    tables = torch.stack(
        [torch.arange(1 + (b + 1) * width - 1, b * width, -1) for b in range(rows)]
    ).to(torch.int32)
    where = positions.expand(rows, -1)  # [B, T]
    slots = slots_of(tables, where, BLOCK)
    return Layout(where, slots, tables)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3"])
def test_logits_match_transformers(name: str, tmp_path: Path) -> None:
    config = config_for(name)
    reference = _hf_model(config)
    reference.save_pretrained(tmp_path)
    loaded_config, state = load_hf(tmp_path, max_seq_len=config.max_seq_len)
    assert loaded_config.is_sliding(0) == config.is_sliding(0)
    assert loaded_config.global_every == config.global_every
    model = build_model(loaded_config, state_dict=state)
    _paged(model, rows=2)

    tokens = torch.randint(
        0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        expected = reference(tokens).logits  # [2, 12, vocab]
        # Prefill 9 tokens, then decode 3 one at a time through the KV cache: the sliding
        # window (4 in tiny-gemma3) is crossed on both paths.
        prefill = model(tokens[:, :9], _layout(model, 2, torch.arange(9)))
        steps = [
            model(tokens[:, i : i + 1], _layout(model, 2, torch.tensor([i]))) for i in range(9, 12)
        ]
    ours = torch.cat([prefill, *steps], dim=1)
    error = (ours - expected).norm() / expected.norm()
    assert error < RELATIVE_TOLERANCE, f"relative error {error:.2e}"
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))


def test_last_only_returns_the_last_position() -> None:
    config = config_for("tiny-llama")
    model = build_model(config, seed=3)
    _paged(model, rows=1)
    tokens = torch.randint(0, config.vocab_size, (1, 5))
    with torch.no_grad():
        full = model(tokens, _layout(model, 1, torch.arange(5)))
        last = model(tokens, _layout(model, 1, torch.arange(5)), last_only=True)
    assert last.shape == (1, 1, config.vocab_size)
    assert torch.allclose(full[:, -1:], last, atol=1e-6)


def test_heads_must_be_a_multiple_of_kv_heads() -> None:
    with pytest.raises(AssertionError, match="multiple of KV heads"):
        ModelConfig("bad", 16, 32, 1, n_heads=3, n_kv_heads=2, head_dim=8, intermediate_size=8)


def test_a_position_s_slot_is_its_block_s_through_its_row_s_table() -> None:
    tables = torch.tensor([[3, 5], [7, 2]], dtype=torch.int32)
    positions = torch.tensor([[0, 3, 4, 6], [1, 4, 5, 7]])
    expected = torch.tensor([[12, 15, 20, 22], [29, 8, 9, 11]])
    assert torch.equal(slots_of(tables, positions, 4), expected)


def test_rows_join_the_row_before_where_they_read_the_same_blocks() -> None:
    """The decode kernel computes a run of rows together when each reads the blocks the one
    before reads: a prompt's tokens as rows of one query, or a row's next tokens. The first row
    never joins (the last row's table, one row down cyclically, is not its predecessor)."""
    tables = torch.tensor([[3, 4], [1, 2], [1, 2], [1, 5], [3, 4]], dtype=torch.int32)
    assert row_joins(tables, 1).tolist() == [False, False, True, False, False]
    same = torch.tensor([[1, 2], [1, 2]], dtype=torch.int32)
    assert row_joins(same, 1).tolist() == [False, True]  # the first: nothing before it
    assert row_joins(torch.tensor([[7]], dtype=torch.int32), 1).tolist() == [False]
    # Three queries a row: a row's later queries join; its first joins where the table repeats.
    assert row_joins(tables[:3], 3).tolist() == [
        *[False, True, True],
        *[False, True, True],
        *[True, True, True],
    ]

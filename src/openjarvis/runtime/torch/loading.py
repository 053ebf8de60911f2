"""Weights for the torch engine: Hugging Face safetensors checkpoints, GGUF files (dequantised with
the `gguf` package), or random values for any config; always named as in model.py.
"""

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import GgufHeader, GgufTensor, read_gguf_header
from openjarvis.runtime.torch.model import ModelConfig, Transformer, checkpoint_parts

__all__ = [
    "build_model",
    "config_from_gguf",
    "config_from_hf",
    "load_checkpoint",
    "load_gguf",
    "load_hf",
]

StateDict = dict[str, Tensor]

# Hugging Face parameter names (after "model.layers.N.") -> ours (after "layers.N.").
_HF_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "self_attn.q_norm": "attention.q_norm",
    "self_attn.k_norm": "attention.k_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
}
# Gemma's extra norms move the meaning of "post_attention_layernorm" (see _hf_layer_name).
_HF_GEMMA_NAMES = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffn_norm",
}
_GGUF_LAYER_NAMES = {
    "attn_q": "attention.wq",
    "attn_k": "attention.wk",
    "attn_v": "attention.wv",
    "attn_output": "attention.wo",
    "attn_q_norm": "attention.q_norm",
    "attn_k_norm": "attention.k_norm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
    "attn_norm": "attention_norm",
    "ffn_norm": "ffn_norm",
    "post_attention_norm": "post_attention_norm",
    "post_ffw_norm": "post_ffn_norm",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}
_SUPPORTED_HF = ("llama", "qwen2", "qwen3", "gemma3_text", "gemma3", "mistral")
_SUPPORTED_GGUF = ("llama", "qwen2", "qwen3", "gemma3")


def load_checkpoint(path: Path, max_seq_len: int | None = None) -> tuple[ModelConfig, StateDict]:
    """A GGUF file or a Hugging Face checkpoint folder -> (config, full float32 state dict)."""
    if path.is_dir():
        return load_hf(path, max_seq_len)
    if path.suffix == ".gguf":
        return load_gguf(path, max_seq_len)
    raise UserError(
        f"cannot load {path}: pass a .gguf file or a folder with config.json and *.safetensors"
    )


# ---- Hugging Face -------------------------------------------------------------------------


def config_from_hf(raw: dict[str, Any], max_seq_len: int | None = None) -> ModelConfig:
    """Our config from a Hugging Face config.json (transformers 4 or 5 spelling; parsed JSON,
    so its values are Any)."""
    model_type = str(raw.get("model_type", ""))
    if "text_config" in raw:  # multimodal Gemma 3: the language model's config is nested
        raw = {**raw["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in _SUPPORTED_HF:
        raise UserError(
            f"model_type {model_type!r} is not supported by the torch engine "
            f"(supported: {', '.join(_SUPPORTED_HF)}); use the llama.cpp engine with a GGUF"
        )
    get = raw.get

    def need(key: str) -> Any:
        if get(key) is None:
            raise UserError(f"config.json has no {key}: not a text decoder the torch engine reads")
        return raw[key]

    gemma = model_type.startswith("gemma3")
    heads = int(need("num_attention_heads"))
    dim = int(need("hidden_size"))
    head_dim = int(get("head_dim") or dim // heads)
    global_rope, local_rope = _hf_rope(raw)
    layers = int(need("num_hidden_layers"))
    window = get("sliding_window")
    if model_type.startswith("qwen") and not get("use_sliding_window"):
        window = None
    global_every = _global_every(raw.get("layer_types"), layers) if window else 0
    config = ModelConfig(
        name=str(get("_name_or_path") or model_type),
        vocab_size=int(need("vocab_size")),
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=int(get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(need("intermediate_size")),
        norm_eps=float(get("rms_norm_eps") or 1e-6),
        rope_base=float(global_rope.get("rope_theta", 10_000.0)),
        rope_scaling=global_rope if global_rope.get("rope_type", "default") != "default" else None,
        rope_local_base=float(local_rope["rope_theta"]) if local_rope else None,
        activation="gelu_tanh" if gemma else "silu",
        qkv_bias=bool(get("attention_bias")) or model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "gemma3_text", "gemma3"),
        tie_embeddings=bool(get("tie_word_embeddings")),
        max_seq_len=max_seq_len or int(get("max_position_embeddings") or 4096),
        norm_weight_offset=1.0 if gemma else 0.0,
        scale_embeddings=gemma,
        sandwich_norms=gemma,
        query_scale=float(need("query_pre_attn_scalar")) ** -0.5 if gemma else None,
        attn_logit_softcap=_float_or_none(get("attn_logit_softcapping")),
        final_logit_softcap=_float_or_none(get("final_logit_softcapping")),
        sliding_window=int(window) if window else None,
        global_every=global_every,
        extra={"eos_token_id": get("eos_token_id"), "bos_token_id": get("bos_token_id")},
    )
    return config


def _hf_rope(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(global, local) RoPE parameters: transformers 5 nests them in rope_parameters, per layer
    type for Gemma 3; transformers 4 wrote rope_theta, rope_scaling and rope_local_base_freq."""
    parameters = raw.get("rope_parameters")
    if isinstance(parameters, dict):
        if "full_attention" in parameters:
            return dict(parameters["full_attention"]), parameters.get("sliding_attention")
        return dict(parameters), None
    rope: dict[str, Any] = {"rope_theta": raw.get("rope_theta", 10_000.0)}
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict):
        rope.update(scaling)
        rope["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    local_base = raw.get("rope_local_base_freq")
    return rope, ({"rope_theta": local_base} if local_base else None)


def _global_every(layer_types: object, layers: int) -> int:
    """The period of global layers in a list of layer types; 0 when every layer slides."""
    if not isinstance(layer_types, list):
        return 0
    global_layers = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if not global_layers:
        return 0
    period = global_layers[0] + 1
    expected = [i for i in range(layers) if (i + 1) % period == 0]
    if global_layers != expected:
        raise UserError(
            f"layer pattern {layer_types} is not periodic; the torch engine supports a global "
            "layer every N layers only"
        )
    return period


def _float_or_none(value: float | str | None) -> float | None:
    return None if value is None else float(value)


def _hf_layer_name(rest: str, gemma: bool) -> str | None:
    module, _, kind = rest.rpartition(".")
    if gemma and module in _HF_GEMMA_NAMES:
        return f"{_HF_GEMMA_NAMES[module]}.{kind}"
    if module == "post_attention_layernorm":  # Llama / Qwen: the norm before the MLP
        return f"ffn_norm.{kind}"
    mapped = _HF_LAYER_NAMES.get(module)
    return f"{mapped}.{kind}" if mapped else None


def load_hf(folder: Path, max_seq_len: int | None = None) -> tuple[ModelConfig, StateDict]:
    """config.json + *.safetensors -> (config, state dict in float32 with our names)."""
    from safetensors.torch import load_file

    config_path = folder / "config.json"
    files = sorted(folder.glob("*.safetensors"))
    if not config_path.is_file() or not files:
        raise UserError(f"{folder} needs config.json and *.safetensors (a Hugging Face checkpoint)")
    config = config_from_hf(json.loads(config_path.read_text()), max_seq_len)
    gemma = config.norm_weight_offset != 0.0
    state: StateDict = {}
    layer_pattern = re.compile(r"(?:model\.)?(?:language_model\.)?layers\.(\d+)\.(.+)")
    for file in files:
        for name, tensor in load_file(str(file)).items():
            ours = None
            if match := layer_pattern.fullmatch(name.removeprefix("model.")):
                rest = _hf_layer_name(match.group(2), gemma)
                ours = f"layers.{match.group(1)}.{rest}" if rest else None
            elif name.endswith("embed_tokens.weight"):
                ours = "tok_embeddings.weight"
            elif name.endswith("norm.weight") and "layers" not in name:
                ours = "norm.weight"
            elif name == "lm_head.weight":
                ours = "output.weight"
            if ours is None:
                raise UserError(f"unexpected tensor {name!r} in {file.name}: not a text decoder?")
            state[ours] = tensor.float()
    return config, _with_output(config, state)


def _with_output(config: ModelConfig, state: StateDict) -> StateDict:
    if config.tie_embeddings or "output.weight" not in state:
        state["output.weight"] = state["tok_embeddings.weight"]
    return state


# ---- GGUF ---------------------------------------------------------------------------------


def config_from_gguf(header: GgufHeader, max_seq_len: int | None = None) -> ModelConfig:
    """Our config from a GGUF's metadata (llama.cpp's keys)."""
    metadata = header.metadata

    def value(key: str, default: object = None) -> Any:  # a metadata value of any GGUF type
        found = metadata.get(key)
        return default if found is None else found

    arch = str(value("general.architecture"))
    if arch not in _SUPPORTED_GGUF:
        raise UserError(
            f"GGUF architecture {arch!r} is not supported by the torch engine "
            f"(supported: {', '.join(_SUPPORTED_GGUF)}); use the llama.cpp engine"
        )
    tensor_names = set(header.tensors)
    if "rope_freqs.weight" in tensor_names:
        raise UserError("GGUFs with rope_freqs (Llama 3.1 long context) are not supported yet")

    def arch_int(key: str, default: int | None = None) -> int:
        return int(value(f"{arch}.{key}", default))

    dim = arch_int("embedding_length")
    heads = arch_int("attention.head_count")
    head_dim = arch_int("attention.key_length", dim // heads)
    layers = arch_int("block_count")
    gemma = arch == "gemma3"
    vocab = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    scaling_type = value(f"{arch}.rope.scaling.type")
    rope_scaling: dict[str, float | str] | None = None
    if scaling_type == "linear":
        rope_scaling = {
            "rope_type": "linear",
            "factor": float(value(f"{arch}.rope.scaling.factor")),
        }
    # llama.cpp fixes what the GGUF leaves out for Gemma 3: the local RoPE base (10k), a
    # global layer every 6, and a query scale of 1/sqrt(dim / heads) for the 27B model only.
    query_scale = None
    if gemma:
        query_scale = (dim / heads) ** -0.5 if layers == 62 else head_dim**-0.5
    window = value(f"{arch}.attention.sliding_window") if gemma else None
    return ModelConfig(
        name=str(value("general.name", arch)),
        vocab_size=vocab,
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=arch_int("attention.head_count_kv", heads),
        head_dim=head_dim,
        intermediate_size=arch_int("feed_forward_length"),
        norm_eps=float(value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(value(f"{arch}.rope.freq_base", 10_000.0)),
        rope_scaling=rope_scaling,
        rope_local_base=10_000.0 if gemma else None,
        activation="gelu_tanh" if gemma else "silu",
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        tie_embeddings="output.weight" not in tensor_names,
        max_seq_len=max_seq_len or arch_int("context_length", 4096),
        norm_weight_offset=1.0 if gemma else 0.0,
        scale_embeddings=gemma,
        sandwich_norms=gemma,
        query_scale=query_scale,
        sliding_window=int(window) if window else None,
        global_every=6 if gemma else 0,
        extra={
            "eos_token_id": value("tokenizer.ggml.eos_token_id"),
            "bos_token_id": value("tokenizer.ggml.bos_token_id"),
        },
    )


def load_gguf(path: Path, max_seq_len: int | None = None) -> tuple[ModelConfig, StateDict]:
    """A GGUF file -> (config, state dict): every tensor dequantised to float32."""
    try:
        import gguf
    except ImportError as error:
        raise UserError("the gguf package is missing: pip install 'openjarvis[torch]'") from error
    header = read_gguf_header(path)
    config = config_from_gguf(header, max_seq_len)
    kinds = _tensor_kinds(gguf, header, path)
    gemma = config.norm_weight_offset != 0.0
    llama = header.architecture == "llama"
    data = np.memmap(path, dtype=np.uint8, mode="r")
    state: StateDict = {}
    for gguf_name, tensor in header.tensors.items():
        name, kind = _gguf_name(gguf_name), kinds[gguf_name]
        raw = _tensor_bytes(data, tensor, gguf.GGML_QUANT_SIZES[kind], path, gguf_name)
        if kind == gguf.GGMLQuantizationType.Q8_0:
            weight = _dequantize_q8_0(raw)
        else:
            weight = torch.from_numpy(np.array(gguf.dequantize(raw, kind), dtype=np.float32))
        # llama.cpp's converter stores Gemma's norm weights as 1 + w; we keep w (offset 1).
        if gemma and name.endswith("norm.weight"):
            weight = weight - 1.0
        if llama:
            weight = _unpermute_llama(name, weight, config)
        state[name] = weight
    return config, _with_output(config, state)


def _tensor_kinds(gguf: Any, header: GgufHeader, path: Path) -> dict[str, Any]:
    """Each tensor's ggml type, all checked before any weight is read: a type gguf does not
    know, or one its dequantize cannot read (integer tensors, llama.cpp's intermediate Q8_1
    and Q8_K), is one clear error. gguf.quants names a class after each type it reads."""
    kinds = {}
    for name, tensor in header.tensors.items():
        try:
            kind = gguf.GGMLQuantizationType(tensor.kind)
        except ValueError:
            raise UserError(
                f"tensor {name} of {path} has an unknown type ({tensor.kind})"
            ) from None
        if kind.name not in ("F32", "F16") and not isinstance(
            getattr(gguf.quants, kind.name, None), type
        ):
            raise UserError(
                f"tensor {name} of {path} is of type {kind.name}, which the torch engine cannot "
                "read; use the llama.cpp engine"
            )
        kinds[name] = kind
    return kinds


def _tensor_bytes(
    data: np.ndarray, tensor: GgufTensor, block_sizes: tuple[int, int], path: Path, name: str
) -> np.ndarray:
    """A tensor's bytes in the file, shaped [slowest dimension first ..., bytes of a row]: what
    gguf's dequantize takes for every type. `block_sizes`: (values, bytes) of one block."""
    block, block_bytes = block_sizes
    *outer, row = reversed(tensor.shape)
    row_bytes = row // block * block_bytes
    size = row_bytes
    for dimension in outer:
        size *= dimension
    if tensor.offset + size > data.size:
        raise UserError(f"{path} ends inside tensor {name}; re-download the model file")
    return data[tensor.offset : tensor.offset + size].reshape(*outer, row_bytes)


def _dequantize_q8_0(data: np.ndarray) -> Tensor:
    """Q8_0 in torch: blocks of a float16 scale and 32 int8 values. The same arithmetic as
    gguf.dequantize, ten times faster on the large embedding tables that use this type."""
    rows = data.shape[0]
    blocks = torch.from_numpy(np.array(data, dtype=np.uint8)).view(-1, 34)  # [n_blocks, 34]
    scales = blocks[:, :2].contiguous().view(torch.float16).float()  # [n_blocks, 1]
    values = blocks[:, 2:].contiguous().view(torch.int8).float()  # [n_blocks, 32]
    return (values * scales).view(rows, -1)


def _gguf_name(name: str) -> str:
    if name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[name]
    match = re.fullmatch(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)", name)
    if match and match.group(2) in _GGUF_LAYER_NAMES:
        return f"layers.{match.group(1)}.{_GGUF_LAYER_NAMES[match.group(2)]}.{match.group(3)}"
    raise UserError(f"unexpected tensor {name!r} in the GGUF: not a supported text decoder")


def _unpermute_llama(name: str, weight: Tensor, config: ModelConfig) -> Tensor:
    """llama.cpp's converter reorders Llama's q and k rows for its interleaved RoPE; undo it
    so that the halves layout of model.py applies."""
    if name.endswith("attention.wq.weight"):
        heads = config.n_heads
    elif name.endswith("attention.wk.weight"):
        heads = config.n_kv_heads
    else:
        return weight
    rest = weight.shape[1:]
    half = config.head_dim // 2
    return weight.reshape(heads, half, 2, *rest).transpose(1, 2).reshape(weight.shape)


# ---- building -----------------------------------------------------------------------------


def build_model(
    config: ModelConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    state_dict: StateDict | None = None,
    shard: Callable[[Transformer], Callable[[str, Tensor], Tensor]] | None = None,
    seed: int = 0,
) -> Transformer:
    """A model on `device`: built shapeless on the meta device, optionally sharded (`shard` is
    tensor parallelism's pass, returning how to cut each full tensor), then given weights: the
    state dict's, or random ones (`seed`; for benchmarks).

    Random weights are drawn full-size on the device, one tensor at a time, and then cut, so
    that every world size gets the same model from the same seed."""
    with torch.device("meta"):
        model = Transformer(config)
        full_shapes = {
            name: parameter.shape
            for name, parameter in Transformer(config).named_parameters(remove_duplicate=False)
        }
    cut: Callable[[str, Tensor], Tensor] = shard(model) if shard else (lambda name, t: t)
    model = model.to_empty(device=device).to(dtype)
    model.init_buffers()
    parameters = dict(model.named_parameters(remove_duplicate=False))
    # Each parameter's checkpoint tensors, with their full shapes (stacked ones are cut apart).
    parts = {
        name: [
            (
                part,
                full_shapes[name] if rows is None else torch.Size((rows, *full_shapes[name][1:])),
            )
            for part, rows in checkpoint_parts(config, name)
        ]
        for name in parameters
    }
    if state_dict is not None:
        missing = {part for pieces in parts.values() for part, _ in pieces} - set(state_dict)
        if missing:
            raise UserError(f"the checkpoint lacks {sorted(missing)[:3]}...: wrong architecture?")
    random = _RandomWeights(config, seed, torch.device(device), dtype)
    with torch.no_grad():
        for name, parameter in parameters.items():
            # A stacked parameter is this process's cut of each part, one after another.
            pieces = [
                cut(part, state_dict[part] if state_dict is not None else random.draw(part, shape))
                for part, shape in parts[name]
            ]
            parameter.copy_(pieces[0] if len(pieces) == 1 else torch.cat(pieces))
    return model.eval().requires_grad_(False)


class _RandomWeights:
    """Weights with the scale of a trained model (unit-variance activations), not zeros: decode
    time must not depend on special values (a GPU can run faster on zeros, which would flatter
    the timings)."""

    def __init__(self, config: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.embedding: Tensor | None = None

    def draw(self, name: str, shape: torch.Size) -> Tensor:
        if name.endswith("norm.weight"):
            return torch.full(shape, 1.0 - self.config.norm_weight_offset, device=self.device)
        if len(shape) == 1:  # biases
            return torch.zeros(shape, device=self.device)
        if name == "output.weight" and self.config.tie_embeddings:
            assert self.embedding is not None, "the embedding is drawn before the output head"
            return self.embedding
        std = 1.0 if name == "tok_embeddings.weight" else shape[-1] ** -0.5
        full = torch.empty(shape, device=self.device, dtype=self.dtype)
        full.normal_(0.0, std, generator=self.generator)
        if name == "tok_embeddings.weight":
            self.embedding = full
        return full

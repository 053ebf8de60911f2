"""Where a one-row decode step's time goes in the fused layer kernel (kernels/decode_layer.py):
the step's layers as one persistent launch a layer, as five launches a layer (the engine's
way), five with programmatic dependent launch, and each phase alone (18 launches of it for
Gemma 3 270M), all replayed from CUDA graphs, against the step's bytes over the copy
bandwidth. Random bf16 weights of a
preset's shape, `--context` positions cached.

`PYTHONPATH=src python3 benchmarks/one_row_phases.py --preset gemma-3-270m --context 400 [--sweep]`
"""

import argparse
import json
from functools import partial

import torch
from persistent_probe import graph_ms  # this folder is on the path

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="gemma-3-270m")
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also each phase at 4 warps a program, attention at other tiles and combines, "
        "and the five launches at other shapes (with PDL where Triton has it)",
    )
    args = parser.parse_args()
    from openjarvis.kernels import decode_layer
    from openjarvis.kernels.decode_layer import PHASES, gdc_wait
    from openjarvis.runtime.torch.decode_roofline import DecodeRoofline, device_bandwidth
    from openjarvis.runtime.torch.model import Transformer, config_for
    from openjarvis.runtime.torch.one_row import OneRowStep
    from openjarvis.runtime.torch.paged import Layout, slots_of

    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    config = config_for(args.preset)
    with device:
        model = Transformer(config).to(dtype)
    model.init_buffers()
    block_size = 16
    width = -(-(args.context + 1) // block_size)
    model.setup_caches(width + 1, block_size, dtype)
    table = torch.arange(1, width + 1, dtype=torch.int32, device=device).view(1, -1)
    positions = torch.arange(args.context + 1, device=device).view(1, -1)
    slots = slots_of(table, positions, block_size)
    tokens = torch.randint(0, config.vocab_size, (1, args.context + 1), device=device)
    with torch.inference_mode():
        cached = args.context
        model(tokens[:, :cached], Layout(positions[:, :cached], slots[:, :cached], table))
        step = (tokens[:, cached:], positions[:, cached:], slots[:, cached:], table)
        programs = torch.cuda.get_device_properties(device).multi_processor_count
        results: dict[str, object] = {"preset": args.preset, "context": args.context}
        five = tuple(range(1, PHASES + 1))
        alone = tuple((p,) for p in five)
        # Each run: a label, the module's launch constants it sets (the engine's stay as they
        # are), the launches timed (one persistent launch a layer, five, a phase alone), PDL.
        # First the engine's build: one launch, five, each phase alone, five with programmatic
        # dependent launch (where this Triton has its grid controls).
        runs: list[tuple[str, dict[str, int], tuple[tuple[int, ...], ...], bool]] = [
            ("", {}, ((0,), five, *alone), False)
        ]
        runs += [("pdl", {}, (five,), True)] if gdc_wait is not None else []
        # The sweep: each phase at 4 warps; attention at other key tiles and its parts combined
        # several a load; the five launches at 16 keys; a build whose every phase fits an SM
        # beside the one before (tiles of at most 8,192 weights, attention at 4 warps:
        # kernel_resources.py), with and without PDL; the products' tiles alone smaller, PDL.
        fit = {"_MOST_TILE": 8192, "_TILE": 16, "_ATTENTION_WARPS": 4, "_COMBINE": 16}
        sweeps: list[tuple[str, dict[str, int], tuple[tuple[int, ...], ...], bool]] = [
            ("warps_4", {"_WARPS": 4, "_ATTENTION_WARPS": 4}, alone, False),
            *((f"tile_{t}", {"_TILE": t}, ((2,),), False) for t in (16, 32, 128)),
            ("tile_64_combine_8", {"_COMBINE": 8}, ((2,),), False),
            ("tile_32_combine_8", {"_TILE": 32, "_COMBINE": 8}, ((2,),), False),
            *(
                (f"tile_16_combine_{c}", {"_TILE": 16, "_COMBINE": c}, ((2,), five), False)
                for c in (8, 16)
            ),
            ("tile_16", {"_TILE": 16}, ((0,), five), False),
            ("fit", fit, ((0,), five), False),
        ]
        if gdc_wait is not None:
            sweeps.append(("tile_16_combine_16_pdl", {"_TILE": 16, "_COMBINE": 16}, (five,), True))
            sweeps.append(("fit_pdl", fit, (five,), True))
            # The products' tiles alone smaller (attention as the engine's): for the wide shapes
            # every phase then fits beside the one before (8,192 weights; kernel_resources.py).
            sweeps += [
                (f"most_tile_{most}_pdl", {"_MOST_TILE": most}, (five,), True)
                for most in (8192, 16384)
            ]
        runs += sweeps if args.sweep else []
        for label, changes, launches, pdl in runs:
            kept = {name: getattr(decode_layer, name) for name in changes}
            for name, value in changes.items():
                setattr(decode_layer, name, value)
            try:
                for phases in launches:
                    one_row = OneRowStep(model, programs, phases=phases, pdl=pdl)
                    ms = graph_ms(partial(one_row, *step), 300)
                    what = "five_launches" if len(phases) > 1 else f"phase_{phases[0]}_alone"
                    what = "one_launch" if phases == (0,) else what
                    results[f"{what}_{label}_ms" if label else f"{what}_ms"] = round(ms, 4)
            finally:
                for name, value in kept.items():
                    setattr(decode_layer, name, value)
        head = model.output.weight
        row = torch.randn(1, config.dim, device=device, dtype=dtype)
        results["head_ms"] = round(graph_ms(lambda: torch.nn.functional.linear(row, head), 300), 4)
    # The step's bytes (weights, the cached keys and values) at the copy bandwidth.
    bandwidth = device_bandwidth(device)
    assert bandwidth is not None
    bytes_read = DecodeRoofline(config, "bfloat16")
    step_bytes = bytes_read.weight_bytes() + bytes_read.kv_bytes(args.context + 1)
    roofline = step_bytes / bandwidth.bytes_per_s * 1e3
    results["roofline_ms"] = round(roofline, 4)
    one_launch_ms = results["one_launch_ms"]
    assert isinstance(one_launch_ms, float)
    results["share_one_launch"] = round(roofline / one_launch_ms, 3)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""``sidco paper``: the SIDCo paper's setting projected with its PyTorch era's kernel costs and today's."""

from __future__ import annotations

import argparse

from sidco.commands import COMMANDS, add_store_argument, dump_json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``paper`` subcommand."""
    parser = subparsers.add_parser(
        "paper",
        help=COMMANDS["paper"],
        description=(
            "Project the SIDCo paper's setting (8 V100 nodes, 1 and 10 Gbit/s, ResNet-50 and VGG-16 as one "
            "bucket, Top-k, DGC, SIDCo-E/-P/-GP and no compression; analytic fidelity) twice: with the kernel "
            "costs of the paper's PyTorch 1.3 (its single-block torch.topk, from published measurements) and "
            "with today's. Prints SIDCo's best speed-up over each baseline in each era with its error band, "
            "beside the paper's reported figures, and says in words whether the headline holds (docs/paper.md)."
        ),
    )
    parser.add_argument("--layouts", default="resnet50,vgg16",
                        help="comma-separated layouts (default resnet50,vgg16: the paper's CNNs)")
    parser.add_argument("--densities", default="0.01,0.001", help="comma-separated densities (default 0.01,0.001)")
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Project both eras and print the comparison."""
    from pipeline.catalog import layout_names
    from pipeline.paper import PAPER, project_paper
    from results.store import Store
    from units import format_bandwidth, parse_density, parse_list

    layouts = parse_list(args.layouts, str)
    unknown = [name for name in layouts if name not in layout_names()]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; choose from {', '.join(layout_names())}")
    densities = parse_list(args.densities, parse_density)
    with Store(args.store) as store:
        result = project_paper(store, layouts=layouts, densities=densities)
    if args.json:
        print(dump_json(result))
        return 0
    print(f"SIDCo paper setting: {PAPER['nodes']} x {PAPER['device']}, {PAPER['bucket_mode']} bucket, batch "
          f"{PAPER['batch_size']} per worker, {PAPER['precision']}, analytic fidelity; 'then' = {PAPER['era']} kernels "
          f"(torch.topk one block per slice), 'today' = today's")
    print(f"{'layout':<9} {'link':>9} {'density':>8} {'era':<6} {'SIDCo':<9} {'over none':>18} {'over Top-k':>18} "
          f"{'over DGC':>18}")
    for r in result["rows"]:
        cells = " ".join(f"{r[f'over_{b}']['speedup']:>6.2f}x ({r[f'over_{b}']['low']:.2f}-{r[f'over_{b}']['high']:.2f})"
                         .rjust(18) for b in ("none", "topk", "dgc"))
        print(f"{r['layout']:<9} {format_bandwidth(r['bandwidth_bps']):>9} {r['density']:>8g} {r['era']:<6} "
              f"{r['sidco']:<9} {cells}")
    print("speed-up = the baseline's iteration time / the fastest SIDCo variant's (band: both at the ends of "
          "their error bands)")
    for line in result["verdict"]:
        print(line)
    return 0

"""Worker process of an emulated DiLoCo run across sites: one rank on gloo.

Run by :func:`emulation.sites.run_sites`. Ranks ``k·R … (k+1)·R − 1`` are site ``k`` (``R`` =
world size ÷ ``--sites``). Each site trains a built-in workload (:mod:`traces.workloads`, its
own SGD with momentum) under DistributedDataParallel inside the site (a process group of the
site's ranks: nothing crosses the WAN); every ``--sync-every`` (H) inner steps the sites take
DiLoCo's outer step (:func:`convergence.diloco.outer_step`: pseudo-gradient, outer Nesterov
SGD, every site reset) with the pseudo-gradient averaged across the sites by one gloo
all-reduce among the ranks of the same place in every site (the only cross-site traffic).

Writes, as JSON: ``model_bytes`` (the fp32 pseudo-gradient, bytes) and per timed round
``round_s`` (from the round's first inner step to the end of its outer step), ``inner_s`` (each
inner step: forward, backward with the site's all-reduce, optimizer step), ``outer_s`` (the outer
step) and ``exchange_s`` (its cross-site all-reduce), all seconds. One world barrier starts the
timed rounds; after it the outer all-reduce is the only synchronisation, as in DiLoCo.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import traces.workloads
from convergence.diloco import outer_step
from convergence.optim import OUTER_LR, OUTER_MOMENTUM, outer
from emulation.process_group import base_parser, finish, init_gloo


def _parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--sites", type=int, required=True)
    parser.add_argument("--sync-every", type=int, required=True, help="inner steps per outer step (H)")
    parser.add_argument("--rounds", type=int, required=True, help="timed rounds of H inner steps and an outer step")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--batch-size", type=int, required=True, help="samples per rank per inner step")
    parser.add_argument("--outer-lr", type=float, default=OUTER_LR)
    parser.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM)
    parser.add_argument("--seed", type=int, default=0)
    return parser


class CrossSiteMean:
    """The outer exchange across sites as :func:`convergence.diloco.outer_step` asks it: the mean of
    this rank's flat pseudo-gradient over ``sites`` sites by one all-reduce on ``group``; the last
    call's wall time is ``seconds``."""

    def __init__(self, group: Any, sites: int) -> None:
        self.group = group
        self.sites = sites
        self.seconds = 0.0

    def average(self, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
        """The mean over the sites of this site's one pseudo-gradient (``deltas``: one flat vector)."""
        (delta,) = deltas
        total = delta.clone()
        start = time.perf_counter()
        dist.all_reduce(total, group=self.group)
        self.seconds = time.perf_counter() - start
        return total.div_(self.sites)


def main() -> None:
    """Entry point: ``python -m emulation.sites_worker ... --workload resnet20 --sites 2 --sync-every 4``."""
    args = _parser().parse_args()
    init_gloo(args)
    per_site = args.world_size // args.sites
    site, place = divmod(args.rank, per_site)
    # every rank takes part in creating every group, in the same order
    site_groups = [dist.new_group(list(range(k * per_site, (k + 1) * per_site))) for k in range(args.sites)]
    cross_groups = [dist.new_group([k * per_site + j for k in range(args.sites)]) for j in range(per_site)]
    torch.manual_seed(args.seed)
    workload = traces.workloads.build(args.workload, batch_size=args.batch_size, seed=args.seed)
    shared = copy.deepcopy(workload.model)
    params = [p for p in shared.parameters() if p.requires_grad]
    model = DistributedDataParallel(workload.model, process_group=site_groups[site])
    inner = workload.optimizer(model)
    outer_optimizer = outer(params, args.outer_lr, args.outer_momentum)
    exchange = CrossSiteMean(cross_groups[place], args.sites)
    batches = workload.batches(args.rank, args.world_size)
    rounds = []
    for index in range(args.warmup_rounds + args.rounds):
        if index == args.warmup_rounds:
            dist.barrier()
        start = time.perf_counter()
        inner_s = []
        for _ in range(args.sync_every):
            step_start = time.perf_counter()
            inputs, targets = next(batches)
            inner.zero_grad(set_to_none=True)
            workload.loss(model(inputs), targets).backward()
            inner.step()
            inner_s.append(time.perf_counter() - step_start)
        outer_start = time.perf_counter()
        outer_step(shared, params, [model.module], exchange, outer_optimizer)
        end = time.perf_counter()
        rounds.append({"round_s": end - start, "inner_s": inner_s, "outer_s": end - outer_start,
                       "exchange_s": exchange.seconds})
    finish(args, {"rank": args.rank, "site": site, "rounds": rounds[args.warmup_rounds:],
                  "model_bytes": sum(p.numel() * p.element_size() for p in params)})


if __name__ == "__main__":
    main()

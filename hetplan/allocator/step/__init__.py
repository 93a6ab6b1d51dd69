"""The co-adaptive step (`hetplan.allocator.rebalance` describes it) in its stages, each a small unit:

- `state`: what the stages share (`StepState`: inputs, where jobs end up, undo, shares; `ClassView`);
- `admit`: who runs;
- `gpu_types`: GPU types by comparative advantage, moves and swaps under the stability rule (`Rule`);
- `place`: one node (best fit, largest share, TUNE), a running job's old place back;
- `gangs`: a job larger than any node over several nodes of one type;
- `resize`: growing into free cores and RAM, shrinking to floors;
- `step`: `Step.run`, the stages in order (and backfill).
"""

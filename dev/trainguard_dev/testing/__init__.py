"""The helpers that tests, benchmarks and the demo share, each in one place.

- `runs`: TrainingRun manifests (a small valid run, the checked-in examples, the reference
  trainer on the process-backed nodes) and the synthetic token shards such a run trains on;
- `processes`: `trainguard operator` as a local process, and stopping a child process;
- `polling`: waiting until something holds, with an error that names what never happened;
- `pods`: a pod's files on a process-backed node (its volumes, the trainer's heartbeat);
- `servers`: real S3 (SeaweedFS) and SSH servers on loopback for the remote layers.
- `chart`: trainguard installed in-cluster from its Helm chart, in namespaces that enforce
  Pod Security `restricted` (the real-node tests and `trainguard demo --real-nodes`).
- `goodput`: the goodput benchmark's arithmetic (goodput, steps recomputed, time lost per
  failure), from the steps a run executed and the failures caused to it.
- `move`: the move benchmark's arithmetic (the phases of a move to a fresh node, from the
  milestones the system records, and their medians).

Nothing here is part of the product: `trainguard` never imports it.
"""

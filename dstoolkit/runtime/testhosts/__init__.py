"""Multi-node test hosts: network namespaces on one machine (launch/testhosts.sh) that stand in for nodes.

Shared by the multi-node tests (tests/dist/test_multinode_*.py, which assert; their pytest fixtures stay in
tests/dist/multinode/fixtures.py) and benchmarks/multinode_*.py (which record figures):

* `hosts`: `TestHosts` (bring N hosts up under a run-unique name, always tear them down), per-host jobs with
  hard deadlines, `unavailable_reason` (root, iproute2, netns);
* `jobs`: the generated launch commands run on the hosts (environment, start/wait helpers);
* `scenarios`: the multi-node scenarios themselves (two-node spec, trainer flags, fault/throttle runs).

Needs a source checkout (it drives launch/testhosts.sh and runs the trainer from the repository) and root.
Importing this package starts nothing; submodules import no torch.
"""

"""The shape of the test session's one control plane, shared by the tiers that use it.

`tests/conftest.py` starts it with these nodes; the real-node tier adds its real nodes to it
(`tests/realnodes/conftest.py`) and, bringing them back, asks for the same shape. A module of
its own, because several folders have a `conftest.py` and `from conftest import` would find
whichever pytest loaded first.
"""

TEST_NODES = 3  # kwok GPU nodes
TEST_PROCESS_NODES = 2  # process-backed GPU nodes

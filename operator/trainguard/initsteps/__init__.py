"""The training pod's init steps, one module per command, run in the operator's image.

`trainguard preflight` (`preflight`): test the local disks and the GPU first;
`trainguard stage-data` (`stage_data`, with its `sources`): copy the data to local disk,
verified; `trainguard restore` (`restore`): bring the newest valid checkpoint into L1.
`common` holds what they share (log lines, byte counts, page-cache hints).
"""

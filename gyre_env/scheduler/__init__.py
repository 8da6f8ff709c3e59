"""The runtime of elastic cells: what runs while ``gyre train --elastic`` trains.

- ``cell``: a cell holds one engine and one trainer and switches between ROLLOUT and
  TRAINING; ``migration`` moves its in-flight requests' KV to another cell;
- ``core_cell``: the core cell keeps the only optimizer state and applies the summed
  gradients of the training cells; ``versions``: the weight board and the heartbeat;
- ``policy``: the waterlevel policy (plain objects, no I/O), ``peers``: the policies it
  is compared with;
- ``driver``: the event loop that runs a policy over cells and a workload;
  ``chat_workload``: a workload without sandboxes (benchmarks);
- ``local_cells`` / ``ray_cells``: cells in this process, or as Ray actors;
  ``profile``: a profiler trace of each role switch.

The simulator (``gyre_env.sim``) drives the same policy objects; nothing here imports it
or the drivers of ``gyre_env.train``.
"""

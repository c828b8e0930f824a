"""How a run is executed: its plan (``plan``: the stages of ``preprocess.stages`` with their inputs and parameters),
and the executors that schedule them: one Beam pipeline or one per part (``pipeline``, on ``beamrun`` and
``beamargs``), the local process pool (``local``), or separate jobs, a step at a time (``steps``); then the
dataset published (``publish``). ``part_budget`` chooses the number of parts for a memory budget.
"""

"""Processes: the launcher (launch.py, dp_launch.py), the scheduler process's main (scheduler_process.py),
tensor-parallel followers (tp_worker.py), the data-parallel router (router.py, router_policy.py) and
child-process hygiene (process_utils.py)."""

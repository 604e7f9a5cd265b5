"""The evaluation stage of `tracectl run`: every arm on the same held-out tasks, and what each spent.

    stage.py    the arms, the GRPO budget curve, the paired statistics (the stage's entry point)
    gepa.py     the GEPA prompt-optimisation arm
    scoring.py  what one arm scored, read back from its rollout job's trajectories
    budget.py   what TRACE spent before the evaluation, read back from the stage records
"""

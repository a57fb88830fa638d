"""The verdict engine: pod views in, verdicts out. Pure; shared by the operator and replay.

Private: plugin authors import `deathwatch.policy`, nothing here.
"""

"""dstoolkit.tune: Bayesian (optuna TPE) search over the generated config space, with short real runs or estimates.

    from dstoolkit.tune import TuneOptions, run_study, TuneSpace, TunePoint
"""
from dstoolkit.tune.space import TuneInputError, TunePoint, TuneSpace
from dstoolkit.tune.options import TuneOptions, TuneResult
from dstoolkit.tune.study import run_study

__all__ = ["TuneInputError", "TuneOptions", "TunePoint", "TuneResult", "TuneSpace", "run_study"]

"""One rank of a data-parallel run to a target: ``python -m tbdzoo.training.rank JOB.json``.

The rank of tbdzoo/distributed/rank.py with one mode more, "target" (train_rank in
distributed.py); the launcher names this module in the job (``rank_module``) when it trains.
Valid Python 3.6 (CNTK's ranks)."""
from ..distributed.rank import main
from .distributed import train_rank

if __name__ == "__main__":
    main(modes={"target": train_rank})

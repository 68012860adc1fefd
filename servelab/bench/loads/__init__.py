"""Load modes: how requests are offered to the server. One module per idea:

- common.py     the Recorder (keeps records as they complete) and the Target's traits
- closed.py     single stream and closed-loop concurrency
- arrivals.py   open-loop send schedules (Poisson, gamma with burstiness, constant), from a seeded RNG
- open_loop.py  open-loop request rate: sends at scheduled times, never blocked by responses
- search.py     the max-load search under SLOs (bracketing, then bisection)
"""

from servelab.bench.loads.closed import run_concurrency, run_single
from servelab.bench.loads.common import Recorder, Target, make_spec
from servelab.bench.loads.open_loop import rate_tag, run_rate

__all__ = ["Recorder", "Target", "make_spec", "rate_tag", "run_concurrency", "run_rate", "run_single"]

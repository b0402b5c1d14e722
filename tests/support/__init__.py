"""What several test modules share, one definition each: test modules import from here, never
from one another.

- `worker`: the fast worker options (`FAST`, `RESUME`) and `running`, a worker of an App for
  the length of a block;
- `poll`: `until` (a condition polled until it holds) and `in_state` (a task read until it is
  in a state);
- `store`: tasks, dispatches, outcomes and agents' beats written straight to a store, for the
  store's contract tests;
- `apps`: the test applications (a saga, a family of parent and children, approvals waiting
  for events, a shop with local calls) and the keyring of the sealing tests;
- `relay`: status messages relayed to brokers, and a listener of a port;
- `typescript`: the TypeScript client built once for the tests that drive it;
- `why`: the worker options by role and the polling of the tests of why a task waits;
- `dashboard`, `readme`: a query of the dashboard's tests, the README's first example.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout."""

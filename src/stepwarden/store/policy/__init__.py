"""What each writing store method reads, decides and writes, once for every database.

Each function is a flow (`_flow.py`): the transaction of one store method, as named queries
and the rules (`rules.py`) that decide between them. The dialects' SQL (`sql/<dialect>/`)
applies a batch set-based (PostgreSQL: arrays) or one row at a time (SQLite); both return the
same columns. A flow notes the wake-ups its commit owes in `wake`.

No flow is stopped by one row it cannot handle: the supervisor's sweep sets such a task
aside for an operator (`rules.plan_set_aside`) and goes on with the others.
"""

from __future__ import annotations

from ._shared import lease_fence as lease_fence
from .agents import advance as advance
from .agents import advance_alone as advance_alone
from .agents import beat as beat
from .agents import call_facts as call_facts
from .agents import claim_fair_requests as claim_fair_requests
from .agents import claim_requests as claim_requests
from .agents import claim_within_limits as claim_within_limits
from .agents import complete_steps as complete_steps
from .agents import hand_back as hand_back
from .agents import heartbeat_step as heartbeat_step
from .agents import held as held
from .agents import leave as leave
from .agents import lost as lost
from .agents import note_run as note_run
from .agents import recorded_already as recorded_already
from .agents import requests as requests
from .agents import stop_calls as stop_calls
from .application import MapRefused as MapRefused
from .application import purge as purge
from .application import record_delivery as record_delivery
from .application import record_events as record_events
from .application import relay_delivered as relay_delivered
from .application import relay_failed as relay_failed
from .application import relay_refused as relay_refused
from .application import same_input as same_input
from .application import submit as submit
from .application import submit_fenced as submit_fenced
from .application import write_shard_map as write_shard_map
from .operator import CASCADING as CASCADING
from .operator import children_ended as children_ended
from .operator import fork as fork
from .operator import operate as operate
from .scheduler import claim_fair_tasks as claim_fair_tasks
from .scheduler import claim_pairs as claim_pairs
from .scheduler import claim_tasks as claim_tasks
from .scheduler import claimed as claimed
from .scheduler import dispatch_steps as dispatch_steps
from .scheduler import finish_tasks as finish_tasks
from .scheduler import recorded as recorded
from .scheduler import replayed as replayed
from .scheduler import tag_task as tag_task
from .schedulers import held_in_time as held_in_time
from .schedulers import release_gone_schedulers as release_gone_schedulers
from .schedulers import release_held as release_held
from .schedulers import scheduler_beat as scheduler_beat
from .schedulers import scheduler_leave as scheduler_leave
from .schedules import create_ticks as create_ticks
from .schedules import pause_schedule as pause_schedule
from .schedules import store_schedules as store_schedules
from .supervisor import acquire_lease as acquire_lease
from .supervisor import lease_lapses as lease_lapses
from .supervisor import look_lease as look_lease
from .supervisor import release_lease as release_lease
from .supervisor import sweep as sweep
from .supervisor import sweep_round as sweep_round
from .supervisor import sweep_steps as sweep_steps
from .supervisor import try_lease as try_lease
from .waits import park as park
from .waits import send_event as send_event
from .waits import wait as wait
from .waits import wake_due as wake_due

-- A step's complete_by, computed by one function wherever it is set (a dispatch, a dispatch
-- again, a heartbeat, a reassignment): `p_now` + the step's complete_within, never past its
-- task's complete_by nor its total timeout (give_up_by), and never before `p_not_before` (a
-- heartbeat does not shorten it); a NULL is no candidate (the reassignment passes no task
-- complete_by). A single SELECT of a non-strict expression, STABLE (a timestamptz plus an
-- interval depends on the time zone), with no SET clause: the planner inlines it into the
-- statements that call it, which keep their generic plans.
CREATE FUNCTION stepwarden_step_deadline(p_now timestamptz, p_complete_within interval,
                                         p_task_complete_by timestamptz,
                                         p_give_up_by timestamptz, p_not_before timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT GREATEST(p_not_before,
                    LEAST(p_now + p_complete_within, p_task_complete_by, p_give_up_by))
$$;

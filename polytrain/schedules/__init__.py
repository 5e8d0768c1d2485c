"""Pipeline schedules as plain data: actions, orders of work, their registry and their checks."""

"""Lanes, by claim order: an interactive run's tasks are claimed before any bulk task.

A module of its own, importing nothing, so that what only reads lanes (``conveyor status``'s oldest queued
task per lane) does not load the planner (runtime/expand.py) to learn two names.
"""

from __future__ import annotations

LANE_RANKS = {"interactive": 0, "bulk": 1}

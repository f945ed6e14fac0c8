"""The speculation controller: against every fixed k in simulation (``sim``: no model, the
engine's own policy calls, many seeds), and its own host work per drafting step (``cost``)."""

from __future__ import annotations

from benchmarks.registry import Case
from benchmarks.suites import controller_sim, policy_cost

CASES = {
    "sim": Case("the goodput controller against fixed k, simulated (no model)",
                controller_sim.add_arguments, controller_sim.run),
    "cost": Case("the speculation policy's host work per drafting step (no model)",
                 policy_cost.add_arguments, policy_cost.run),
}

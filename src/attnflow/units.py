"""The model's units, named once: every quantity is dimensionless, time included (docs/model.md, "Units and
metadata"). No imports: the engine's declarations (``attnflow.observables``) read it too."""

CONVENTIONS = "CF-1.10"  # the metadata conventions stores and summaries follow
# The flow dx_i/dt = P_x_i(v_i) fixes no time scale: its time is a pure number, CF units "1", named so
# in every long name and description that gives a time or a rate.
TIME_UNITS = "1"
FLOW_TIME = "dimensionless time of the flow"
RATE = f"per unit {FLOW_TIME}"

__all__ = ["CONVENTIONS", "FLOW_TIME", "RATE", "TIME_UNITS"]

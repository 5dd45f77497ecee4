"""analysis: judgement (rules, alerts, scheduler) and the composition of the service and CLI."""

"""The width policy inside SGLang (issue 70): each step's width by expected accepted tokens per measured
millisecond (step_policy), the step costs timed at start-up (graph_timing), and their numbers on /metrics."""

"""What a DDTREE server does once, at start-up: the flags carried to SGLang's processes (server_env), the start-up
refusals, the rotated API key (keys), the worker's set-up and a schedule's verify widths."""

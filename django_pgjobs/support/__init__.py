"""Small helpers that know nothing of the queue's design: how an age reads, text made
safe for terminals, stored JSON decoded as hostile input, the backoff and the reconnect
throttle, the checks on what users pass in, the entries of ``Job.errors``, a dedicated
psycopg connection's parameters, the OpenTelemetry spans and whether the app is
installed."""

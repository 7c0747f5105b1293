"""The Temporal activities: thin ``@activity.defn`` classes at the boundary, each
calling the libraries of ``certflow`` (acme, dns, store) and turning their typed
errors into ``ApplicationError`` s. ``registry`` lists every activity the worker
registers, with its name pinned (histories hold it) and what the UI shows of it."""

"""ACME as certflow speaks it to a CA: the client and its account (``client``), the
CA's problem documents read as Let's Encrypt's Boulder writes them (``problems``,
its tables ``rate_limits`` and ``refusals``), one CA's orders from new-order to
stored certificate (``orders``: ``exchange`` shared by its steps ``new_order``,
``validation``, ``finalize``), the CA of each call (``router``), ARI (``ari``), and
the pacing of polls and new orders (``pacing``, ``slots``)."""

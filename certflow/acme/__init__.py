"""ACME as certflow speaks it to a CA: the client and its account (``client``), the
CA's problem documents read as Let's Encrypt's Boulder writes them (``problems``), one
CA's orders from new-order to stored certificate (``orders``), ARI (``ari``), and the
pacing of polls and new orders (``pacing``, ``slots``)."""

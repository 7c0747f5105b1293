"""The product-facing side: ``CertflowClient`` (``client``), the ``certflow``
command (``cli`` parses, ``commands`` runs, ``tables`` prints; ``runs`` is
``migrate-runs``), the domain check the product runs before a request, how
certflow starts a workflow (``starts``), and the codec server operators decode
payloads with."""

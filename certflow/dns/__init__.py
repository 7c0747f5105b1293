"""What the CA will see before it is asked: DNS lookups through the resolver
(``lookup``), the CNAME to the edge (``cname``), CAA as Boulder reads it (its records
``caa_records``, the set that decides ``caa_climb``, what it allows
``caa_verdict``), the HTTP-01 fetch as Boulder's VA makes it (``http01_fetch``, each
GET ``http01_exchange``) and the addresses it refuses (``reserved``); ``checks``
puts them together for one hostname."""

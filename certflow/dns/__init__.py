"""What the CA will see before it is asked: DNS lookups through the resolver
(``lookup``), the CNAME to the edge (``cname``), CAA as Boulder reads it (``caa``), the
HTTP-01 fetch as Boulder's VA makes it (``http01``) and the addresses it refuses
(``reserved``); ``checks`` puts them together for one hostname."""

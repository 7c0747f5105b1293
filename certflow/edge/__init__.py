"""What faces the internet: the HTTP-01 responder the CA fetches challenges from
(``responder``) and the certificates a TLS edge serves by SNI (``serving``)."""

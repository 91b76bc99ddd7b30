-- Who may aim a push subscription at each registered webhook: a principal, or '*' for
-- every principal. Webhooks registered before grants existed were open to everyone.
CREATE TABLE push_endpoint_grants (
    url       TEXT NOT NULL,
    principal TEXT NOT NULL,
    PRIMARY KEY (url, principal)
);

INSERT INTO push_endpoint_grants (url, principal) SELECT url, '*' FROM push_endpoints;

-- Counts per minute of what no row keeps a time of (issue 33, the console's rates over time):
-- `delivered`, the messages applications accepted. Written in the settle's own transaction,
-- one row per (minute, series, gateway) so that gateways never contend for one; read summed
-- over gateways; rows older than two hours are deleted by the sweeper.
CREATE TABLE minute_counts (
    minute  bigint NOT NULL,
    series  text NOT NULL,
    gateway text NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (minute, series, gateway)
);

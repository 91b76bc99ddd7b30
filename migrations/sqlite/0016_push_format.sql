-- Push subscriptions gain a format (DESIGN §5): `json` (the webhook of before) or `soap` (a SOAP
-- envelope to a SOAP endpoint). The rules are JSON; existing push subscriptions say `json`
-- explicitly from now on (the code also reads a missing format as `json`).
UPDATE subscriptions SET rules = json_set(rules, '$.format', 'json')
    WHERE rules ->> '$.mode' = 'push' AND json_type(rules, '$.format') IS NULL;

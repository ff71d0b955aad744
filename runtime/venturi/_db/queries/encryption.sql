-- Encrypted payloads (venturi.encryption): `venturi rekey`'s statements.

-- sealed_after --
-- Up to :n jobs after :after (keyset by id) with a payload or carry sealed with a key other
-- than :current. An admin pass over the whole table, in bounded batches.
SELECT id, kind, payload::text AS payload, carry::text AS carry
FROM {prefix}_jobs
WHERE id > :after::uuid
  AND ((payload ? 'venturi:sealed'
        AND split_part(payload ->> 'venturi:sealed', ':', 1) <> :current::text)
    OR (carry ? 'venturi:sealed'
        AND split_part(carry ->> 'venturi:sealed', ':', 1) <> :current::text))
ORDER BY id
LIMIT :n;

-- sealed_rewrite --
-- Store re-sealed values where the job still holds what was read: a merge or a settle that
-- wrote in between keeps its own value (sealed with the current key, or taken next pass).
WITH u AS (
    SELECT * FROM unnest(:ids::uuid[], :old_payloads::text[], :payloads::text[],
                         :old_carries::text[], :carries::text[])
        AS u(id, old_payload, payload, old_carry, carry)
), rewritten AS (
    UPDATE {prefix}_jobs AS j SET
        payload = coalesce(u.payload::jsonb, j.payload),
        carry = coalesce(u.carry::jsonb, j.carry)
    FROM u
    WHERE j.id = u.id AND j.payload = u.old_payload::jsonb
      AND j.carry IS NOT DISTINCT FROM u.old_carry::jsonb
    RETURNING j.id
)
SELECT count(*) AS n FROM rewritten;

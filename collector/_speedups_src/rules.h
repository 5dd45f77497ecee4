/* The envelope rules the C accelerator applies, copied from their definitions in Python
 * (rules.py), each once: here, and the two name lists (key_names,
 * sources) in envelope.c and the number bins (NB_*) in rollup.c, beside the code that uses them.
 * tests/collector/test_speedups_rules.py reads them from the source and holds each to its Python
 * definition, so that a rule changed in Python and not here fails a test instead of letting the
 * fast path accept what the reference refuses. */
#ifndef SHAPEWATCH_SPEEDUPS_RULES_H
#define SHAPEWATCH_SPEEDUPS_RULES_H

/* the known fields (rules.KNOWN_FIELDS): their names are key_names in envelope.c, in this order */
enum { K_EVENT_ID, K_TS, K_MODEL, K_PROMPT_VERSION, K_CONTRACT, K_SERVED_MODEL, K_CONTRACT_VERSION,
       K_SOURCE, K_RUN_ID, K_AGENT_RELEASE, K_FINISH_REASON, K_OUTPUT, K_ATTRIBUTES, NKEYS };
#define EVENT_ID_MAX 128            /* characters of a client's event_id */
#define DEFAULT_CONTRACT "default"  /* the contract of an envelope that names none */
#define PAYLOAD_DIGEST_SIZE 16      /* envelope.payload_hash: blake2b(digest_size=16) */
#define LINE_ID_DIGEST_SIZE 8       /* rules.line_id: blake2b(line, digest_size=8) */
#define LINE_ID_FORMAT "%U:%zd:%U"  /* rules.line_id: f"{prefix}:{n}:{hexdigest}" */
#define ENVELOPE_ITEMS 16           /* the fields of envelope.Envelope, built by scan_lines */
/* Numbers orjson writes back exactly as they were read (its float format is repr's shortest
 * round trip): the scanner takes only these and declines any other literal. */
#define FLOAT_MAX_DIGITS 15         /* significant digits: sys.float_info.dig, all a double keeps */
#define FLOAT_MAX_LEADING_ZEROS 3   /* 0.0001 comes back as such (orjson turns to an exponent
                                     * below 1e-5; taking fewer than it could is only slower) */
#define INT_MAX_DIGITS 18           /* any such integer is an int64, written as it is */

#endif

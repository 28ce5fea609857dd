/* The span recorder in C: what a sampled request records on the event loop, kept as fixed-size binary
 * records in one buffer until the export takes them (see trace_spans.py for the Python side).
 *
 * Why C: with spans recorded in Python a traced `simple` request cost ~7 us more in-process (10-17% fewer
 * requests/s over HTTP), spread over a span object, its ids, a context variable, the tuples that waited for
 * export and marshal-ing them; each Python step runs with cold caches on the request path. With this
 * recorder it costs ~3.5 us (benchmarks/results/observability.md). A span is one small object whose end
 * copies 112 bytes into the buffer: names and attribute dicts the request path reuses (a route's, a
 * model version's) are registered once (`share`) and recorded as table indices; anything else
 * a span carries (events, further children, a request's own dicts) rides along as one Python tuple.
 *
 * A record (`Record`, decoded by trace_spans.RECORD) holds the span and, inline, the first model span
 * added once done (`SpanCore.model_span`: a model that calls no other), which covers a plain infer
 * request in one record. Not thread-safe, like the Python spans it replaces: a request's spans live on
 * its event loop (the GIL is held throughout).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define FLAG_REMOTE 1u    /* the parent span is the client's */
#define FLAG_MODEL 2u     /* the record carries a model span */
#define REF_EXTRA (-1)    /* a name or attributes not shared: in the record's extras tuple */
#define MAX_SHARED 4096   /* shared objects at most; later ones ride in extras */
#define STATUS_ERROR 2

typedef struct {
    uint64_t trace_hi, trace_lo, span_id, parent_id;
    int64_t start, end, m_enqueue, m_start, m_end, m_batch, extra; /* extra: extras sequence number or -1 */
    int32_t name, attributes, m_name, m_attributes;
    uint8_t status, kind, flags, pad[5];
} Record;

_Static_assert(sizeof(Record) == 112, "trace_spans.RECORD must match Record");

static int64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t monotonic_ns(void) { /* what time.perf_counter_ns and time.monotonic_ns read on Linux */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- Recorder ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Record *records;             /* queued records: records[head:count] */
    Py_ssize_t head, count, capacity, max_size, batch_size;
    long long num_dropped;
    PyObject *extras;            /* extras tuples of queued records, oldest first */
    int64_t extras_base;         /* sequence number of extras[0] */
    Py_ssize_t shared_taken;     /* shared objects already handed to the export */
    PyObject *notify;            /* notify(count) when the first record of a batch or a full batch waits */
    PyObject *span_type, *current;  /* the Span class to create, the `current_span` context variable */
    int64_t clock_offset;        /* wall clock minus monotonic clock, refreshed by the export */
    uint64_t rng[2];             /* xorshift128+ for span and trace ids */
} Recorder;

typedef struct {
    PyObject_HEAD
    Recorder *recorder;
    uint64_t trace_hi, trace_lo, span_id, parent_id;
    int64_t start, m_enqueue, m_start, m_end, m_batch;
    PyObject *name, *attributes, *trace_state, *status_message, *events, *children, *token, *m_name, *m_attributes;
    int status, kind, remote, has_model;
} SpanCore;

static PyTypeObject RecorderType, SpanCoreType;

/* The shared objects, one table for the process (model versions register theirs without knowing which
 * server traces them): a list (index = the reference in records) and an open-addressing map from each
 * object (by identity) to its index. */
static PyObject *shared;
#define MAP_SIZE 16384 /* a power of two, > 2 * MAX_SHARED */
static PyObject *shared_keys[MAP_SIZE];
static int32_t shared_values[MAP_SIZE];

static uint64_t next_id(Recorder *r) {
    uint64_t s1 = r->rng[0];
    const uint64_t s0 = r->rng[1];
    r->rng[0] = s0;
    s1 ^= s1 << 23;
    r->rng[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
    uint64_t id = r->rng[1] + s0;
    return id ? id : 1;
}

static Py_ssize_t slot_of(PyObject *obj) {
    uint64_t h = ((uintptr_t)obj >> 4) * 0x9E3779B97F4A7C15ULL;
    Py_ssize_t i = (Py_ssize_t)(h >> 40) & (MAP_SIZE - 1);
    while (shared_keys[i] != NULL && shared_keys[i] != obj)
        i = (i + 1) & (MAP_SIZE - 1);
    return i;
}

static int32_t shared_ref(PyObject *obj) {
    if (obj == NULL) /* an attribute deleted from Python */
        return REF_EXTRA;
    Py_ssize_t i = slot_of(obj);
    return shared_keys[i] == obj ? shared_values[i] : REF_EXTRA;
}

static PyObject *share(PyObject *module, PyObject *obj) {
    /* share(obj) -> obj: registers `obj` (a name, or an attributes dict never changed again) to be
     * recorded by reference. At most MAX_SHARED in a process; later ones are recorded in full. */
    Py_ssize_t i = slot_of(obj);
    if (shared_keys[i] == NULL && PyList_GET_SIZE(shared) < MAX_SHARED) {
        if (PyList_Append(shared, obj) < 0)
            return NULL;
        shared_keys[i] = obj; /* kept alive by `shared` */
        shared_values[i] = (int32_t)(PyList_GET_SIZE(shared) - 1);
    }
    Py_INCREF(obj);
    return obj;
}

static int Recorder_init(Recorder *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_size", "batch_size", "span_type", "current", NULL};
    Py_ssize_t max_size, batch_size;
    PyObject *span_type, *current;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nnO!O!", kwlist, &max_size, &batch_size, &PyType_Type, &span_type,
                                     &PyContextVar_Type, &current))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)span_type, &SpanCoreType)) {
        PyErr_SetString(PyExc_TypeError, "span_type must subclass SpanCore");
        return -1;
    }
    if (max_size < 0 || batch_size < 1) {
        PyErr_SetString(PyExc_ValueError, "max_size must be >= 0 and batch_size >= 1");
        return -1;
    }
    self->max_size = max_size;
    self->batch_size = batch_size;
    self->extras = PyList_New(0);
    if (!self->extras)
        return -1;
    Py_INCREF(span_type);
    self->span_type = span_type;
    Py_INCREF(current);
    self->current = current;
    Py_INCREF(Py_None);
    self->notify = Py_None;
    if (getrandom(self->rng, sizeof(self->rng), 0) != (ssize_t)sizeof(self->rng)) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (!(self->rng[0] | self->rng[1]))
        self->rng[0] = 1;
    self->clock_offset = wall_ns() - monotonic_ns();
    return 0;
}

static int Recorder_traverse(Recorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->extras);
    Py_VISIT(self->notify);
    Py_VISIT(self->span_type);
    Py_VISIT(self->current);
    return 0;
}

static int Recorder_clear(Recorder *self) {
    Py_CLEAR(self->extras);
    Py_CLEAR(self->notify);
    Py_CLEAR(self->span_type);
    Py_CLEAR(self->current);
    return 0;
}

static void Recorder_dealloc(Recorder *self) {
    PyObject_GC_UnTrack(self);
    Recorder_clear(self);
    PyMem_Free(self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Recorder_take(Recorder *self, PyObject *arg) {
    /* Up to `limit` records, oldest first: (shared_start, new shared objects, records, extras_base, extras),
     * or None when nothing is queued. */
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = self->count - self->head;
    if (limit < n)
        n = limit;
    if (n <= 0)
        Py_RETURN_NONE;
    Record *first = self->records + self->head;
    Py_ssize_t num_extras = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        num_extras += first[i].extra >= 0;
    PyObject *records = PyBytes_FromStringAndSize((const char *)first, n * (Py_ssize_t)sizeof(Record));
    PyObject *extras = PyList_GetSlice(self->extras, 0, num_extras);
    PyObject *new_shared = PyList_GetSlice(shared, self->shared_taken, PyList_GET_SIZE(shared));
    PyObject *result = NULL;
    if (records && extras && new_shared)
        result = Py_BuildValue("(nOOLO)", self->shared_taken, new_shared, records, (long long)self->extras_base,
                               extras);
    if (result && PyList_SetSlice(self->extras, 0, num_extras, NULL) < 0) /* nothing taken unless all is */
        Py_CLEAR(result);
    Py_XDECREF(records);
    Py_XDECREF(extras);
    Py_XDECREF(new_shared);
    if (result == NULL)
        return NULL;
    self->shared_taken = PyList_GET_SIZE(shared);
    self->extras_base += num_extras;
    self->head += n;
    if (self->head == self->count)
        self->head = self->count = 0;
    return result;
}

static PyObject *Recorder_refresh_clocks(Recorder *self, PyObject *unused) {
    self->clock_offset = wall_ns() - monotonic_ns();
    Py_RETURN_NONE;
}

static PyObject *Recorder_get_pending(Recorder *self, void *closure) {
    return PyLong_FromSsize_t(self->count - self->head);
}

static PyObject *Recorder_get_clock_offset(Recorder *self, void *closure) {
    return PyLong_FromLongLong(self->clock_offset);
}

/* Appends a record, making room: moves the queue to the front or grows the array (up to max_size). */
static Record *new_record(Recorder *r) {
    if (r->count == r->capacity && r->head > 0) {
        memmove(r->records, r->records + r->head, (r->count - r->head) * sizeof(Record));
        r->count -= r->head;
        r->head = 0;
    }
    if (r->count == r->capacity) {
        Py_ssize_t capacity = r->capacity ? 2 * r->capacity : 64;
        if (capacity > r->max_size)
            capacity = r->max_size;
        Record *grown = PyMem_Realloc(r->records, capacity * sizeof(Record));
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        r->records = grown;
        r->capacity = capacity;
    }
    return r->records + r->count++;
}

/* ---- W3C trace context ------------------------------------------------------------------------- */

static int hex_value(Py_UCS4 c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int parse_hex(PyObject *s, Py_ssize_t at, int digits, uint64_t *out) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    uint64_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = hex_value(PyUnicode_READ(kind, data, at + i));
        if (d < 0)
            return -1;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* A valid `traceparent` (W3C, version 00 exactly or a later version with optional extra fields) ->
 * 1 with the trace and parent ids; 0 when absent or invalid (the request starts a new trace). */
static int parse_traceparent(PyObject *value, uint64_t *hi, uint64_t *lo, uint64_t *parent) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(value), at = 0;
    int kind = PyUnicode_KIND(value);
    const void *data = PyUnicode_DATA(value);
    while (at < n && (PyUnicode_READ(kind, data, at) == ' ' || PyUnicode_READ(kind, data, at) == '\t'))
        at++;
    if (n - at < 55 || PyUnicode_READ(kind, data, at + 2) != '-' || PyUnicode_READ(kind, data, at + 35) != '-' ||
        PyUnicode_READ(kind, data, at + 52) != '-')
        return 0;
    uint64_t version, flags;
    if (parse_hex(value, at, 2, &version) || parse_hex(value, at + 3, 16, hi) || parse_hex(value, at + 19, 16, lo) ||
        parse_hex(value, at + 36, 16, parent) || parse_hex(value, at + 53, 2, &flags) || version == 0xff)
        return 0;
    Py_ssize_t rest = at + 55;
    int blank = 1, newline = 0;
    for (Py_ssize_t i = rest; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        blank &= c == ' ' || c == '\t';
        newline |= c == '\n';
    }
    if (!blank && (version == 0 || PyUnicode_READ(kind, data, rest) != '-' || newline))
        return 0; /* version 00 has no more fields; later versions' must be `-...` on the line */
    return (*hi || *lo) && *parent;
}

/* `tracestate` as kept: its comma-separated members that hold a '=', each stripped of whitespace. */
static PyObject *clean_tracestate(PyObject *value) {
    PyObject *parts = NULL, *kept = NULL, *result = NULL;
    PyObject *comma = PyUnicode_FromString(","), *equals = PyUnicode_FromString("=");
    parts = comma ? PyUnicode_Split(value, comma, -1) : NULL;
    kept = PyList_New(0);
    if (!parts || !kept || !equals)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
        PyObject *part = PyObject_CallMethod(PyList_GET_ITEM(parts, i), "strip", NULL);
        if (part == NULL)
            goto done;
        int has = PyUnicode_Contains(part, equals);
        if (has < 0 || (has && PyList_Append(kept, part) < 0)) {
            Py_DECREF(part);
            goto done;
        }
        Py_DECREF(part);
    }
    result = PyUnicode_Join(comma, kept);
done:
    Py_XDECREF(comma);
    Py_XDECREF(equals);
    Py_XDECREF(parts);
    Py_XDECREF(kept);
    return result;
}

static PyObject *as_str(PyObject *o) { /* ASGI's bytes (latin-1) or gRPC metadata's str; new reference */
    if (PyBytes_Check(o))
        return PyUnicode_DecodeLatin1(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o), NULL);
    if (PyUnicode_Check(o)) {
        Py_INCREF(o);
        return o;
    }
    return NULL; /* binary gRPC metadata or other: not trace context */
}

static int is_named(PyObject *key, const char *name) {
    if (PyBytes_Check(key))
        return strcmp(PyBytes_AS_STRING(key), name) == 0 && (size_t)PyBytes_GET_SIZE(key) == strlen(name);
    return PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, name) == 0;
}

/* ---- spans ------------------------------------------------------------------------------------- */

static SpanCore *new_span(Recorder *r, PyTypeObject *type, PyObject *name, PyObject *attributes, int kind) {
    SpanCore *s = (SpanCore *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    Py_INCREF(r);
    s->recorder = r;
    Py_INCREF(name);
    s->name = name;
    Py_INCREF(attributes);
    s->attributes = attributes;
    s->kind = kind;
    s->span_id = next_id(r);
    s->start = wall_ns();
    return s;
}

static PyObject *Recorder_server_span(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    /* server_span(name, attributes, headers): a front door's span for a sampled request, child of the
     * client's `traceparent` among `headers` ((name, value) pairs, bytes or str) when valid. */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "server_span(name, attributes, headers)");
        return NULL;
    }
    PyObject *headers = PySequence_Fast(args[2], "headers must be a sequence of (name, value) pairs");
    if (headers == NULL)
        return NULL;
    PyObject *traceparent = NULL, *tracestate = NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(headers); i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(headers, i);
        if (!(PyTuple_Check(pair) || PyList_Check(pair)) || PySequence_Fast_GET_SIZE(pair) != 2)
            continue; /* not a (name, value) pair */
        PyObject *key = PySequence_Fast_GET_ITEM(pair, 0), *value = PySequence_Fast_GET_ITEM(pair, 1);
        if (traceparent == NULL && is_named(key, "traceparent"))
            traceparent = value;
        else if (tracestate == NULL && is_named(key, "tracestate"))
            tracestate = value;
    }
    SpanCore *s = new_span(self, (PyTypeObject *)self->span_type, args[0], args[1], 2 /* SERVER */);
    PyObject *value = traceparent ? as_str(traceparent) : NULL;
    uint64_t hi, lo, parent;
    if (s && value && parse_traceparent(value, &hi, &lo, &parent)) {
        s->trace_hi = hi;
        s->trace_lo = lo;
        s->parent_id = parent;
        s->remote = 1;
        PyObject *state = tracestate ? as_str(tracestate) : NULL;
        s->trace_state = state ? clean_tracestate(state) : NULL;
        Py_XDECREF(state);
        if (s->trace_state == NULL && PyErr_Occurred())
            Py_CLEAR(s);
    } else if (s) {
        s->trace_hi = next_id(self);
        s->trace_lo = next_id(self);
    }
    Py_XDECREF(value);
    Py_DECREF(headers);
    return (PyObject *)s;
}

static int span_init(SpanCore *self, PyObject *args, PyObject *kwds) {
    /* Span(recorder, name, trace_id, parent_id, parent_is_remote, trace_state, kind, attributes) */
    Recorder *recorder;
    PyObject *name, *trace_id, *parent_id, *state, *attributes;
    int remote, kind;
    if (!PyArg_ParseTuple(args, "O!OO!O!pUiO:Span", &RecorderType, &recorder, &name, &PyLong_Type, &trace_id,
                          &PyLong_Type, &parent_id, &remote, &state, &kind, &attributes))
        return -1;
    PyObject *sixty_four = PyLong_FromLong(64);
    PyObject *high = sixty_four ? PyNumber_Rshift(trace_id, sixty_four) : NULL;
    Py_XDECREF(sixty_four);
    if (high == NULL)
        return -1;
    uint64_t hi = PyLong_AsUnsignedLongLongMask(high), lo = PyLong_AsUnsignedLongLongMask(trace_id);
    Py_DECREF(high);
    if (PyErr_Occurred())
        return -1;
    unsigned long long parent = PyLong_AsUnsignedLongLong(parent_id);
    if (parent == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    Py_INCREF(recorder);
    Py_XSETREF(self->recorder, recorder);
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(attributes);
    Py_XSETREF(self->attributes, attributes);
    Py_INCREF(state);
    Py_XSETREF(self->trace_state, state);
    self->trace_hi = hi;
    self->trace_lo = lo;
    self->parent_id = parent;
    self->remote = remote;
    self->kind = kind;
    self->span_id = next_id(recorder);
    self->start = wall_ns();
    return 0;
}

static void span_dealloc(SpanCore *self) {
    Py_XDECREF(self->recorder);
    Py_XDECREF(self->name);
    Py_XDECREF(self->attributes);
    Py_XDECREF(self->trace_state);
    Py_XDECREF(self->status_message);
    Py_XDECREF(self->events);
    Py_XDECREF(self->children);
    Py_XDECREF(self->token);
    Py_XDECREF(self->m_name);
    Py_XDECREF(self->m_attributes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int is_set(PyObject *o) { return o != NULL && o != Py_None && (!PyUnicode_Check(o) || PyUnicode_GET_LENGTH(o)); }

static PyObject *or_none(PyObject *o) { return o ? o : Py_None; }

static PyObject *span_end(SpanCore *self, PyObject *unused) {
    /* Queues the span's record (a span used with `with` ends by itself); dropped and counted when the
     * buffer is full. */
    Recorder *r = self->recorder;
    if (r->count - r->head >= r->max_size) {
        r->num_dropped += 1 + self->has_model + (self->children ? PyList_GET_SIZE(self->children) : 0);
        Py_RETURN_NONE;
    }
    int32_t name = shared_ref(self->name), attributes = shared_ref(self->attributes);
    int32_t m_name = self->has_model ? shared_ref(self->m_name) : 0;
    int32_t m_attributes = self->has_model ? shared_ref(self->m_attributes) : 0;
    Record *rec = new_record(r); /* first: a failure leaves no extras without their record */
    if (rec == NULL)
        return NULL;
    int64_t extra = -1;
    if (name < 0 || attributes < 0 || m_name < 0 || m_attributes < 0 || is_set(self->trace_state) ||
        is_set(self->status_message) || is_set(self->events) || is_set(self->children)) {
        PyObject *t = PyTuple_Pack(8, name < 0 ? or_none(self->name) : Py_None,
                                   attributes < 0 ? or_none(self->attributes) : Py_None,
                                   or_none(self->trace_state), or_none(self->status_message), or_none(self->events),
                                   or_none(self->children), m_name < 0 ? or_none(self->m_name) : Py_None,
                                   m_attributes < 0 ? or_none(self->m_attributes) : Py_None);
        if (t == NULL || PyList_Append(r->extras, t) < 0) {
            Py_XDECREF(t);
            r->count--;
            return NULL;
        }
        Py_DECREF(t);
        extra = r->extras_base + PyList_GET_SIZE(r->extras) - 1;
    }
    *rec = (Record){self->trace_hi, self->trace_lo, self->span_id, self->parent_id, self->start, wall_ns(),
                    self->m_enqueue, self->m_start, self->m_end, self->m_batch, extra, name, attributes, m_name,
                    m_attributes, (uint8_t)self->status, (uint8_t)self->kind,
                    (uint8_t)((self->remote ? FLAG_REMOTE : 0) | (self->has_model ? FLAG_MODEL : 0)), {0}};
    Py_ssize_t waiting = r->count - r->head;
    if ((waiting == 1 || waiting == r->batch_size) && r->notify != NULL && r->notify != Py_None) {
        PyObject *count = PyLong_FromSsize_t(waiting);
        PyObject *result = count ? PyObject_CallOneArg(r->notify, count) : NULL;
        Py_XDECREF(count);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
    }
    Py_RETURN_NONE;
}

static PyObject *span_enter(SpanCore *self, PyObject *unused) {
    PyObject *token = PyContextVar_Set(self->recorder->current, (PyObject *)self);
    if (token == NULL)
        return NULL;
    Py_XSETREF(self->token, token);
    Py_INCREF(self);
    return (PyObject *)self;
}

static int reset_current(SpanCore *self) {
    if (self->token == NULL)
        return 0;
    int rc = PyContextVar_Reset(self->recorder->current, self->token);
    Py_CLEAR(self->token);
    return rc;
}

static PyObject *span_exit(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (reset_current(self) < 0)
        return NULL;
    if (args[1] != Py_None && PyObject_IsInstance(args[1], PyExc_Exception) == 1) {
        PyObject *kind_name = PyObject_GetAttrString(args[0], "__name__");
        PyObject *message = kind_name ? PyUnicode_FromFormat("%U: %S", kind_name, args[1]) : NULL;
        Py_XDECREF(kind_name);
        if (message == NULL)
            return NULL;
        Py_XSETREF(self->status_message, message);
        self->status = STATUS_ERROR;
    }
    PyObject *result = span_end(self, NULL);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_FALSE;
}

static PyObject *span_close(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    /* close(attributes, status_code): a front door's end of a span it entered: the context variable back,
     * the attributes (None: keep) and status set, the span ended. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "close(attributes, status_code)");
        return NULL;
    }
    int status = PyLong_AsLong(args[1]);
    if (status == -1 && PyErr_Occurred())
        return NULL;
    if (reset_current(self) < 0)
        return NULL;
    if (args[0] != Py_None) {
        Py_INCREF(args[0]);
        Py_XSETREF(self->attributes, args[0]);
    }
    self->status = status;
    return span_end(self, NULL);
}

static PyObject *span_child(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    /* child(name, attributes): a new span under this one (enter it to make it current). */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "child(name, attributes)");
        return NULL;
    }
    SpanCore *c = new_span(self->recorder, Py_TYPE(self), args[0], args[1], 1 /* INTERNAL */);
    if (c == NULL)
        return NULL;
    c->trace_hi = self->trace_hi;
    c->trace_lo = self->trace_lo;
    c->parent_id = self->span_id;
    Py_XINCREF(self->trace_state);
    c->trace_state = self->trace_state;
    return (PyObject *)c;
}

static PyObject *span_model_span(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    /* model_span(name, attributes, enqueue_ns, start_ns, end_ns, batch_size, backend_phases): a model that
     * calls no other, added once done from its perf-counter times. The first one without phases goes
     * into the record itself; others as children tuples (`Span._model_child`). */
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "model_span takes 7 arguments");
        return NULL;
    }
    if (self->has_model || PyObject_IsTrue(args[6])) {
        PyObject *method = PyUnicode_FromString("_model_child");
        PyObject *result = method ? PyObject_VectorcallMethod(method, (PyObject *[]){(PyObject *)self, args[0],
                                    args[1], args[2], args[3], args[4], args[5], args[6]}, 8, NULL) : NULL;
        Py_XDECREF(method);
        return result;
    }
    int64_t enqueue = PyLong_AsLongLong(args[2]), start = PyLong_AsLongLong(args[3]), end = PyLong_AsLongLong(args[4]);
    int64_t batch = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    int64_t offset = self->recorder->clock_offset;
    Py_INCREF(args[0]);
    Py_XSETREF(self->m_name, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(self->m_attributes, args[1]);
    self->m_enqueue = enqueue + offset;
    self->m_start = start + offset;
    self->m_end = end + offset;
    self->m_batch = batch;
    self->has_model = 1;
    Py_RETURN_NONE;
}

static PyObject *span_set_status(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "set_status(code, message='')");
        return NULL;
    }
    int status = PyLong_AsLong(args[0]);
    if (status == -1 && PyErr_Occurred())
        return NULL;
    self->status = status;
    if (nargs == 2) {
        Py_INCREF(args[1]);
        Py_XSETREF(self->status_message, args[1]);
    }
    Py_RETURN_NONE;
}

static PyObject *id_from(uint64_t hi, uint64_t lo) {
    PyObject *high = PyLong_FromUnsignedLongLong(hi), *low = PyLong_FromUnsignedLongLong(lo);
    PyObject *sixty_four = PyLong_FromLong(64), *shifted = NULL, *id = NULL;
    if (high && low && sixty_four && (shifted = PyNumber_Lshift(high, sixty_four)))
        id = PyNumber_Or(shifted, low);
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(sixty_four);
    Py_XDECREF(shifted);
    return id;
}

static PyObject *span_get_trace_id(SpanCore *self, void *c) { return id_from(self->trace_hi, self->trace_lo); }
static PyObject *span_get_span_id(SpanCore *self, void *c) { return PyLong_FromUnsignedLongLong(self->span_id); }
static PyObject *span_get_parent_id(SpanCore *self, void *c) { return PyLong_FromUnsignedLongLong(self->parent_id); }
static PyObject *span_get_start_time(SpanCore *self, void *c) { return PyLong_FromLongLong(self->start); }
static PyObject *span_get_status_code(SpanCore *self, void *c) { return PyLong_FromLong(self->status); }
static PyObject *span_get_recorder(SpanCore *self, void *c) {
    Py_INCREF(self->recorder);
    return (PyObject *)self->recorder;
}
static PyObject *span_get_trace_state(SpanCore *self, void *c) {
    return self->trace_state ? Py_NewRef(self->trace_state) : PyUnicode_FromString("");
}

static PyGetSetDef span_getset[] = {
    {"recorder", (getter)span_get_recorder, NULL, NULL, NULL},
    {"trace_id", (getter)span_get_trace_id, NULL, NULL, NULL},
    {"span_id", (getter)span_get_span_id, NULL, NULL, NULL},
    {"parent_id", (getter)span_get_parent_id, NULL, NULL, NULL},
    {"start_time", (getter)span_get_start_time, NULL, NULL, NULL},
    {"status_code", (getter)span_get_status_code, NULL, NULL, NULL},
    {"trace_state", (getter)span_get_trace_state, NULL, NULL, NULL},
    {NULL}};

static PyMemberDef span_members[] = {
    {"name", T_OBJECT, offsetof(SpanCore, name), READONLY, NULL},
    {"attributes", T_OBJECT, offsetof(SpanCore, attributes), 0, NULL},
    {"events", T_OBJECT, offsetof(SpanCore, events), 0, NULL},
    {"children", T_OBJECT, offsetof(SpanCore, children), 0, NULL},
    {"status_message", T_OBJECT, offsetof(SpanCore, status_message), 0, NULL},
    {NULL}};

static PyMethodDef span_methods[] = {
    {"end", (PyCFunction)span_end, METH_NOARGS, NULL},
    {"__enter__", (PyCFunction)span_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))span_exit, METH_FASTCALL, NULL},
    {"close", (PyCFunction)(void (*)(void))span_close, METH_FASTCALL, NULL},
    {"child", (PyCFunction)(void (*)(void))span_child, METH_FASTCALL, NULL},
    {"model_span", (PyCFunction)(void (*)(void))span_model_span, METH_FASTCALL, NULL},
    {"set_status", (PyCFunction)(void (*)(void))span_set_status, METH_FASTCALL, NULL},
    {NULL}};

static PyTypeObject SpanCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    /* No traverse: a span refers to no object that refers back to it (its children and events are
     * data). Its Python subclass is collected as any heap type's instances are, without these fields. */
    .tp_name = "modelplex.observability._span_recorder.SpanCore",
    .tp_basicsize = sizeof(SpanCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)span_init,
    .tp_dealloc = (destructor)span_dealloc,
    .tp_methods = span_methods,
    .tp_members = span_members,
    .tp_getset = span_getset,
};

static PyGetSetDef recorder_getset[] = {
    {"pending", (getter)Recorder_get_pending, NULL, "records waiting for export", NULL},
    {"clock_offset", (getter)Recorder_get_clock_offset, NULL, "wall clock minus perf counter, in ns", NULL},
    {NULL}};

static PyMemberDef recorder_members[] = {
    {"max_size", T_PYSSIZET, offsetof(Recorder, max_size), READONLY, NULL},
    {"batch_size", T_PYSSIZET, offsetof(Recorder, batch_size), READONLY, NULL},
    {"num_dropped", T_LONGLONG, offsetof(Recorder, num_dropped), 0, NULL},
    {"notify", T_OBJECT_EX, offsetof(Recorder, notify), 0, NULL},
    {NULL}};

static PyMethodDef recorder_methods[] = {
    {"take", (PyCFunction)Recorder_take, METH_O, NULL},
    {"refresh_clocks", (PyCFunction)Recorder_refresh_clocks, METH_NOARGS, NULL},
    {"server_span", (PyCFunction)(void (*)(void))Recorder_server_span, METH_FASTCALL, NULL},
    {NULL}};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "modelplex.observability._span_recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recorder_init,
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_traverse = (traverseproc)Recorder_traverse,
    .tp_clear = (inquiry)Recorder_clear,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
    .tp_getset = recorder_getset,
};

static PyMethodDef module_methods[] = {{"share", (PyCFunction)share, METH_O, NULL}, {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_span_recorder", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__span_recorder(void) {
    if (PyType_Ready(&RecorderType) < 0 || PyType_Ready(&SpanCoreType) < 0 || !(shared = PyList_New(0)))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Recorder", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObjectRef(m, "SpanCore", (PyObject *)&SpanCoreType) < 0 ||
        PyModule_AddObjectRef(m, "shared", shared) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_SIZE", sizeof(Record)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

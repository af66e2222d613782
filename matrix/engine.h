/*
 * engine.h
 *		The engine's own declarations, shared by engine.c (its primitives)
 *		and case_steps.c (the steps of each case, and the run).
 *
 * Not the runner's interface: main.c and reference.c see signoff_run()
 * and signoff_case_wanted() through matrix.h.
 */
#ifndef IDEMPOTENCY_MATRIX_ENGINE_H
#define IDEMPOTENCY_MATRIX_ENGINE_H

#include <sys/types.h>

#include "matrix.h"
#include "hello.h"
#include "json.h"

#define KEYSZ 160
#define MAX_PROCS 256			/* process groups of a whole run */
#define MAX_CASE_WORKERS 65		/* case 3s: --stress up to 64, and one */
#define MAX_EXCH 64				/* exchanges open at once */
#define POLL_MS 10
#define TAIL_LINES 8
#define TAIL_KEEP 64			/* lines a log tail keeps in memory (>= TAIL_LINES) */
#define MAX_ITEMS 72			/* case 3s: up to 65 deliveries */
#define MAX_KNOWN 512			/* operation keys of a run (2 a case; the storm's more) */
#define MAX_KEYS 8				/* keys of one case: 2, the storm's STORM_KEYS */

typedef struct signoff_state signoff_state;

/* a process group the run started: a worker, or a command */
typedef struct sproc
{
	bool		used;			/* the slot holds a group of this run */
	pid_t		pid;			/* also its process group (setsid) */
	char		name[16];		/* "w1" */
	char		log[600];
	bool		reaped;
	bool		killed;
	bool		gone;			/* the whole group is gone */
	int			status;			/* exit status, 128 + signal */
	double		started;		/* a worker: now_seconds() at its start */
	bool		pointed;		/* a worker: a point of its has arrived */
} sproc;

/* one delivery of a message: a claimed or a judged point */
typedef struct delivery
{
	char		key[KEYSZ];
	bool		runs;			/* claimed (run or verify), else judged */
	char		verdict[32];
	char		sqlstate[8];
	int			attempt;
	long		pid;
	bool		heartbeat;
	bool		handled;
	bool		killed;
	bool		failed;			/* answered fail at claimed */
	char		mark[32];		/* the case's word for it: "slow", ... */
	char		after[24];		/* an item after it: "released" */
	int			eff_before;		/* effects at claimed or judged (verify; a
								 * user's job: each point); -1 */
	int			eff_after;		/* effects at handled, where counted; -1 */
	bool		stray;			/* not a key of the case it came in */
	bool		has_result;		/* judged: the line gave the stored result */
	char		result[512];
	int			ki;				/* the case's key it maps to; -1: stray */
	double		at;				/* now_seconds() when its point arrived */
	double		handled_at;		/* and its handled point; 0: none */
	char		ended[560];		/* the point ended: how the job ended it, for the notes */
} delivery;

/* one exchange on the socket */
typedef enum
{
	X_READING,
	X_HELD,						/* waiting for the case's answer */
	X_GONE						/* the worker closed it while held */
} xstate;

typedef struct exch
{
	int			fd;
	xstate		state;
	char		buf[4096];
	size_t		len;
	/* the line */
	char		point[16];
	char		job_type[200];
	char		key[KEYSZ];
	char		verdict[32];
	char		sqlstate[8];
	int			attempt;
	long		pid;
	int			v;
	bool		heartbeat;
	bool		has_result;
	char		result[512];	/* optional: the stored result, at judged */
	long		backend_pid;	/* optional: the server process of its transaction */
	char		message[300];	/* optional: the claim's error, at judged (error); the refusal, at ended */
	char		ending[32];		/* the point ended: "PermanentFailure" */
	char		ended_how[200];	/* the point ended: how the delivery then ends */
	hello_info	hello;			/* the point hello's fields */
	int			delivery;		/* index into deliveries, or -1 */
	int			ki;				/* the case's key it maps to, or -1 */
} exch;

typedef struct arm
{
	int			key;			/* index into the case's keys */
	char		point[16];
	bool		on;
} arm;

struct signoff_state
{
	matrix_ctx *ctx;
	const signoff_job *job;
	char		sock[300];
	int			lfd;
	char		cmd_out[300];
	char		cmd_err[300];
	int			command_depth;	/* commands running (run_command in a point's handling) */
	char		effect_addr[80];	/* effect = http/smtp: the endpoint's address */
	int			unmatched;		/* requests to it that named no key, so far */

	/* the policy */
	policy_t	policy;
	char		job_type[160];	/* the run's: <prefix>_<policy> */
	char		map[400];		/* IDEMPOTENCY_SIGNOFF_JOB_TYPES */

	/* the case */
	case_result *cr;
	const char *case_id;
	char		keys[MAX_KEYS][KEYSZ];	/* the run's keys: what enqueue and effects get */
	char		opkey[MAX_KEYS][KEYSZ];	/* the operation keys the worker claims them under */
	bool		opkey_known[MAX_KEYS];	/* given (key, key_command) or seen */
	int			nkeys;
	char		unmapped[KEYSZ];	/* the first key the run could not map */
	int			nunmapped;		/* claims under keys the run could not map */
	bool		unmappable;		/* then every wait ends, and the later cases */
	bool		key_probed;		/* the message was sent once more to see its key again */
	char		known[MAX_KNOWN][KEYSZ];	/* the run's operation keys so far */
	int			nknown;

	/* the policy's cases so far, for late deliveries and the drain */
	policy_result *pr;
	char		case_keys[MAX_CASES][MAX_KEYS][KEYSZ];	/* the run's keys of each */
	char		case_opkeys[MAX_CASES][MAX_KEYS][KEYSZ];	/* the operation keys of each */
	int			case_nkeys[MAX_CASES];
	int			late[MAX_CASES];	/* deliveries that came after the case */
	double		last_delivery;	/* now_seconds() of the latest point */
	double		startup_s;		/* the longest a worker took from its start to its first point */
	int			enqueued[MAX_KEYS];
	int			workers[MAX_CASE_WORKERS];	/* indexes into procs */
	int			nworkers;
	/*
	 * A job file's workers outlive their case, as a queue's workers do: the
	 * next case takes them (start_workers) instead of starting its own,
	 * which saves a start and a stop per case (a Sidekiq worker's stop alone
	 * takes 2.5 s). The reference job's are started per case (case 8's
	 * worker reads IDEMPOTENCY_SIGNOFF_CASE), and a transactional job's.
	 */
	bool		keep_workers;	/* the policy's workers outlive their case */
	int			kept[MAX_CASE_WORKERS]; /* the live ones between cases */
	int			nkept;
	bool		took_kept;		/* the case took them (its first start_workers) */
	int			worker_seq;		/* the policy's workers so far: their names w1, w2 ... */
	arm			arms[8];
	bool		not_armed;		/* a case found no worker reaching its point */
	/*
	 * 7a, 7b: the dead worker's claim, kept young by the runner
	 * (keep_young()) until the message came again, so that the redelivery
	 * is inside the lease however slow the machine
	 */
	bool		young_on;
	int			young_ki;		/* the case's key */
	int			young_attempt;	/* the dead claim's attempt */
	double		young_at;		/* now_seconds() of the last extension */
	int			young_extended;	/* extensions so far */
	char		young_ended[300];	/* why it stopped early: the lease ran out, ... */
	/*
	 * Why the try did not test its case, "" when it did: the machine, not
	 * the job, missed the case's premise (7a, 7b: the database judged the
	 * redelivery after the lease, the runner stopped longer than the lease
	 * so that it could not keep the claim young). signoff_run() runs the
	 * case again under new keys, CASE_TRIES times in all.
	 */
	char		missed[400];
	bool		missed_heartbeat;	/* 12: the worker's heartbeat stalled past the lease */
	char		stopped[700];	/* why the run stops (hello.c: another database); "" */
	bool		stop_said;		/* a case failed with it */
	const case_result *claim_failed;	/* the case a claim error failed at once */

	exch	   *x[MAX_EXCH];
	int			nx;
	delivery   *d;
	int			nd;
	int			dcap;
};

typedef enum
{
	WAIT_OK,
	WAIT_TIMEOUT,
	WAIT_INTERRUPTED,
	WAIT_NO_WORKER,
	WAIT_UNMAPPED,				/* a worker claims under keys the run cannot map */
	WAIT_STOPPED				/* the case or the run failed already (hello.c) */
} wres;

typedef bool (*wait_pred) (signoff_state *s, const void *arg);

/* the run's process groups, the state while a run lasts, the case's first delivery */
extern sproc procs[MAX_PROCS];
extern int	nprocs;
extern signoff_state *live_state;
extern int	case_first_delivery;

void	forget_proc(int i);
bool	parse_line(const char *line, exch *x, char *why, size_t wsz);
void	answer(signoff_state *s, exch *x, const char *word);
void	pump(signoff_state *s, int ms);
void	know_key(signoff_state *s, const char *key);
int		run_command(signoff_state *s, job_field which, const char *key,
						bool pump_meanwhile, StringInfo out);
int		effects_count(signoff_state *s, const char *key, bool pump_meanwhile);
bool	start_workers(signoff_state *s, int n);
bool	start_workers_alike(signoff_state *s, int n);
bool	kill_at(signoff_state *s, exch *x, const char *where);
void	stop_workers(signoff_state *s);
void	stop_workers_now(signoff_state *s);
void	stop_kept_workers(signoff_state *s);
wres	wait_for(signoff_state *s, wait_pred pred, const void *arg,
					  bool need_worker, double limit);
int		count_deliveries(signoff_state *s, int ki);
int		nth_delivery(signoff_state *s, int ki, int n);
int		wait_nth(signoff_state *s, int ki, int n);
void	arm_point(signoff_state *s, int ki, const char *point);
exch	   *wait_held(signoff_state *s, int ki, const char *point);
bool	record_row(signoff_state *s, const char *key, char *status,
					   size_t ssz, int *attempt);
bool	settle(signoff_state *s);
bool	enqueue(signoff_state *s, int ki, job_field which);
void	observe(signoff_state *s, const char *suffix);
void	check_unmatched(signoff_state *s);
bool	wait_stale_checked(signoff_state *s, int ki);
void	case_defect(signoff_state *s, const char *fmt,...) MX_PRINTF(2, 3);
void	keep_young(signoff_state *s, int ki, int attempt);
void	keep_young_stop(signoff_state *s);
double	lease_left(signoff_state *s, int ki);

#endif							/* IDEMPOTENCY_MATRIX_ENGINE_H */

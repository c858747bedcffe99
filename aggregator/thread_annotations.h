// Lock rules the compiler checks: clang's thread-safety analysis
// (-Wthread-safety, an error in clang builds: CMakeLists.txt). A member
// says which lock guards it (GUARDED_BY), a function which lock its caller
// must hold (REQUIRES) or must not hold (EXCLUDES); a lock type says it is
// one (CAPABILITY) and how it is taken and given back (ACQUIRE, RELEASE;
// SCOPED_CAPABILITY for one that holds a lock for its lifetime). clang then
// refuses code that touches a guarded member without its lock.
// NO_THREAD_SAFETY_ANALYSIS turns the check off for one function; say why
// beside it. Other compilers see nothing.
//
// The locks themselves: mutex.h (std::mutex carries no annotation).
#pragma once

#if defined(__clang__)
#define BLKPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define BLKPS_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(name) BLKPS_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY BLKPS_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(lock) BLKPS_THREAD_ANNOTATION(guarded_by(lock))
#define PT_GUARDED_BY(lock) BLKPS_THREAD_ANNOTATION(pt_guarded_by(lock))
#define REQUIRES(...) BLKPS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) BLKPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) BLKPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) BLKPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS BLKPS_THREAD_ANNOTATION(no_thread_safety_analysis)

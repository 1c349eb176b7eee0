// A library loaded with dlopen by test_library.cpp, standing in for libzero_cuda and
// libzero_gpt_cuda: an interface id and an entry point.
extern "C" const char* zero_test_library_id() { return "00112233445566ff"; }
extern "C" int zero_test_library_entry() { return 42; }

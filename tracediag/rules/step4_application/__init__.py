"""Walk step 4, the application against the micro-benchmark: exposed communication and rank skew."""

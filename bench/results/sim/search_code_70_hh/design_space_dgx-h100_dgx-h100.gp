set terminal svg size 900,750 dynamic font "sans,11"
set output "design_space_dgx-h100_dgx-h100.svg"
set datafile separator ","
set title "splitwise dgx-h100/dgx-h100 at 70 req/s: shapes meeting all nine SLOs, by cost"
set xlabel "prompt machines (dgx-h100)"
set ylabel "token machines (dgx-h100)"
set cblabel "cluster cost"
set palette defined (0 "#1a9850", 1 "#fee08b", 2 "#d73027")
set key outside bottom center horizontal
set style fill solid 1.0 noborder
set label 1 "" at 24,3 point pt 3 ps 3 lc rgb "black" front
plot "design_space.csv" skip 1 using 2:3:(0.5):(0.5):((strcol(1) eq "splitwise dgx-h100/dgx-h100" && $7 == 1) ? $4 : NaN) with boxxyerror lc palette title "meets SLOs (colour: cost)", \
     "design_space.csv" skip 1 using 2:((strcol(1) eq "splitwise dgx-h100/dgx-h100" && $7 == 0) ? $3 : NaN):(0.5):(0.5) with boxxyerror lc rgb "#d9d9d9" title "misses an SLO", \
     NaN with points pt 3 ps 2 lc rgb "black" title "cheapest"
